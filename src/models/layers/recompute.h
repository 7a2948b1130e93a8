// Activation recomputation: reentrant checkpointing of a function of tensors, and the two
// places a transformer switches it on (a whole block, or the attention core).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/models.h"

namespace meshsim {

/// A function of tensors that a checkpoint runs in forward and again in backward.
using Recomputable = std::function<torch::Tensor(const std::vector<torch::Tensor>& inputs)>;

/// fn(inputs), keeping only `inputs` for backward, which runs fn again with a graph and
/// backpropagates through it (reentrant activation checkpointing, torch.utils.checkpoint with
/// use_reentrant=True). Gradients reach the inputs and any parameters fn uses. Runs fn plainly
/// when no graph is being recorded or no input needs a gradient.
torch::Tensor checkpoint(const Recomputable& fn, const std::vector<torch::Tensor>& inputs);

/// A transformer block that activation checkpointing can switch on (set_recompute). With
/// `recompute` on, forward() keeps only the block's input and runs forward_plain() again in
/// backward (torch.utils.checkpoint, reentrant).
class CheckpointedBlock {
public:
  virtual ~CheckpointedBlock() = default;
  /// The block itself, never checkpointed (what the checkpoint recomputes).
  virtual torch::Tensor forward_plain(const torch::Tensor& x) = 0;
  /// forward_plain(x), checkpointed when `recompute` is on and a graph is being recorded.
  torch::Tensor checkpointed(const torch::Tensor& x);
  bool recompute = false;
};

/// An attention module whose core selective recomputation can checkpoint (set_recompute):
/// with `recompute_core` on, backward keeps the core's inputs (q, k, v) instead of
/// what the core saves (the [B, heads, T, T] softmax of the eager core). With
/// `recompute_projections` on (op-level recomputation), the query and value projections are
/// checkpointed: backward runs their matmuls again from the block's normalized input.
class CheckpointedAttention {
public:
  virtual ~CheckpointedAttention() = default;
  /// False for a core that keeps nothing selective recomputation would drop (the fused core
  /// keeps q, k, v, its output and one number per row): set_recompute leaves it off.
  virtual bool core_recomputable() const { return true; }
  bool recompute_core = false;
  bool recompute_projections = false;
  /// Whether backward runs the child Linear `name` again (the counts' rerun work, flops.h).
  virtual bool reruns_linear(const std::string& /*name*/) const { return false; }
};

/// A feed-forward whose first matmul op-level recomputation checkpoints with the activation
/// that follows it (GPT's fc and GELU, SwiGLU's gate and SiLU): with `recompute_first` on,
/// backward runs them again from the feed-forward's input instead of keeping the matmul's
/// output.
class CheckpointedFeedForward {
public:
  virtual ~CheckpointedFeedForward() = default;
  bool recompute_first = false;
  /// Whether backward runs the child Linear `name` again (the counts' rerun work, flops.h).
  virtual bool reruns_linear(const std::string& name) const = 0;
};

/// Sets what every transformer block of `model` recomputes in backward (--recompute): Full
/// checkpoints every CheckpointedBlock, Selective every attention core
/// (CheckpointedAttention) that keeps its scores (a fused core is left alone), Op the query
/// and value projections of every CheckpointedAttention and the first matmul of every
/// CheckpointedFeedForward, None none of them.
///
/// Op is torchtitan's op-level selective activation checkpointing (its `selective_ac_option =
/// "op"`): it keeps the output of every matmul but every second one, counted through the
/// block's forward, and recomputes the rest in backward. A Llama block's seven matmuls (q, k,
/// v, o, gate, up, down) alternate between recomputing q, v and gate, and k, o and up (down's
/// output is needed by nothing in the block's backward): in both cases a third of the
/// block's projection FLOPs with grouped kv heads. Op recomputes the first triple on every
/// step. Latent attention's projections and a mixture of experts' experts are left alone.
void set_recompute(torch::nn::Sequential& model, Recompute recompute);

} // namespace meshsim
