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
/// backward (torch.utils.checkpoint, reentrant). With `keep_matmuls` on as well (op-level
/// recomputation), the forward also keeps what kept_linear() and the fused attention core
/// produce, and the recompute takes those from it instead of running them again.
class CheckpointedBlock {
public:
  virtual ~CheckpointedBlock() = default;
  /// The block itself, never checkpointed (what the checkpoint recomputes).
  virtual torch::Tensor forward_plain(const torch::Tensor& x) = 0;
  /// forward_plain(x), checkpointed when `recompute` is on and a graph is being recorded.
  torch::Tensor checkpointed(const torch::Tensor& x);
  bool recompute = false;
  bool keep_matmuls = false;
};

/// What op-level recomputation keeps of one checkpointed block's forward: the outputs of its
/// kept matmuls and of its fused attention core, in the order the forward made them. The
/// block's forward records them; its recompute replays them in the same order.
class KeptOutputs {
public:
  /// While recording (the block's forward), keep() stores; while replaying (its recompute),
  /// take() hands them back in order.
  bool replaying() const { return replaying_; }
  void keep(std::vector<torch::Tensor> outputs);
  /// The next outputs kept; throws std::logic_error when the recompute asks for more than the
  /// forward kept (it ran other code).
  std::vector<torch::Tensor> take();
  /// Recording done: replay from the first.
  void start_replay();
  /// Replay done: lets go of what was kept (the recompute's graph holds what it needs).
  void clear();

private:
  bool replaying_ = false;
  std::vector<std::vector<torch::Tensor>> kept_;
  size_t next_ = 0;
};

/// The KeptOutputs of the checkpointed block this thread runs (its forward or its recompute),
/// or null outside op-level recomputation.
KeptOutputs* current_kept_outputs();

/// Installs `kept` as the thread's KeptOutputs for its lifetime (null: nothing kept, as in a
/// core that runs again under op-level recomputation), then restores the one before.
class KeptOutputsScope {
public:
  explicit KeptOutputsScope(KeptOutputs* kept);
  ~KeptOutputsScope();
  KeptOutputsScope(const KeptOutputsScope&) = delete;
  KeptOutputsScope& operator=(const KeptOutputsScope&) = delete;

private:
  KeptOutputs* previous_;
};

/// linear(x) (a torch::nn::Linear in `linear`), at a call site whose output op-level
/// recomputation keeps: in a block's forward its output is kept; in the recompute that output
/// is returned again, with the linear's backward (dx = g·W, dW = gᵀ·x, db = Σ g), and the
/// matmul does not run again. Elsewhere, or for a module without a 2-D weight, linear(x).
torch::Tensor kept_linear(torch::nn::AnyModule& linear, const torch::Tensor& x);

/// A module some of whose child Linears op-level recomputation keeps: its forward calls them
/// through run_linear(), and the counts leave their work out of what the recompute runs again
/// (flops.h), both asking keeps_linear().
class KeepsLinears {
public:
  virtual ~KeepsLinears() = default;
  virtual bool keeps_linear(const std::string& child) const = 0;

protected:
  /// The child Linear `name` (held in `linear`) on x: through kept_linear() when it is kept.
  torch::Tensor run_linear(const std::string& name, torch::nn::AnyModule& linear,
                           const torch::Tensor& x) const {
    return keeps_linear(name) ? kept_linear(linear, x) : linear.forward(x);
  }
};

/// An attention module whose core selective recomputation can checkpoint (set_recompute):
/// with `recompute_core` on, backward keeps the core's inputs (q, k, v) instead of
/// what the core saves (the [B, heads, T, T] softmax of the eager core).
class CheckpointedAttention {
public:
  virtual ~CheckpointedAttention() = default;
  /// False for a core that keeps nothing selective recomputation would drop (the fused core
  /// keeps q, k, v, its output and one number per row): set_recompute leaves it off.
  virtual bool core_recomputable() const { return true; }
  bool recompute_core = false;
};

/// Sets what every transformer block of `model` recomputes in backward (--recompute): Full
/// checkpoints every CheckpointedBlock, Op every CheckpointedBlock keeping its matmuls
/// (below), Selective every attention core (CheckpointedAttention) that keeps its scores (a
/// fused core is left alone), None none of them.
///
/// Op is torchtitan's op-level selective activation checkpointing (its `selective_ac_option =
/// "op"`, PyTorch's selective checkpointing of a whole block): the forward keeps the output of
/// every other matmul, counted through the block's forward, and of the attention kernel, and
/// backward recomputes the rest of the block from its input, taking the kept outputs instead
/// of running them again. Of a Llama block's seven matmuls (q, k, v, o, gate, up, down) it
/// keeps q, v, gate and down on one step and recomputes k, o and up (on the next the reverse,
/// where down, needed by nothing in the block's backward, is neither kept nor run again: the
/// same FLOPs with grouped kv heads). meshsim keeps q, v, the feed-forward's first and last
/// matmul (kept_linear at those call sites) and the fused core's output and log-sum-exp on
/// every step. Everything else (norms, rotary, activations, products, the other matmuls, an
/// eager core, latent attention's projections and a mixture of experts' routed experts) runs
/// again.
void set_recompute(torch::nn::Sequential& model, Recompute recompute);

} // namespace meshsim
