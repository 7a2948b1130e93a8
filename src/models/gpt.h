// gpt: a small decoder-only transformer (GPT-2 layout, pre-LayerNorm, causal attention, no
// dropout) as a Sequential of embed, block0..block{L-1}, ln_f, head, so strategies can wrap
// it unmodified: tensor parallelism swaps its Linears by name (LinearSlots), activation
// checkpointing is a switch on each block or on each attention core (set_recompute), a
// pipeline cuts between children.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/layers/flops.h"
#include "models/models.h"

namespace meshsim {

/// GPT-2's initializer range: the standard deviation every weight of the GPT and the Llama
/// is drawn with (Llama's initializer_range is 0.02 too).
constexpr double kInitStd = 0.02;

/// A module whose Linear children may be replaced by name with any module of the same
/// forward signature (Tensor -> Tensor). LibTorch's replace_module() only updates the child
/// registry; the module's own holder must be updated too, which is what this does.
class LinearSlots {
public:
  virtual ~LinearSlots() = default;
  /// Replaces child `name` (registry and the holder used by forward). Throws
  /// std::invalid_argument for a name that is not a slot.
  virtual void replace_linear(const std::string& name, torch::nn::AnyModule module) = 0;
  /// A shard of slot `name` must hold a multiple of this many output (column) or input (row)
  /// features: attention splits by whole heads.
  virtual int64_t shard_granularity(const std::string& name) const { return 1; }
};

/// Token embedding wte [vocab, hidden] plus learned position embedding wpe [seq_len, hidden].
class GptEmbeddingImpl : public torch::nn::Module {
public:
  GptEmbeddingImpl(int64_t vocab, int64_t hidden, int64_t seq_len,
                   const torch::TensorOptions& tensors = {});
  /// tokens: int64 [B,T] with T <= seq_len -> [B,T,hidden].
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor wte, wpe;
};
TORCH_MODULE(GptEmbedding);

/// A function of tensors that a checkpoint runs in forward and again in backward.
using Recomputable = std::function<torch::Tensor(const std::vector<torch::Tensor>& inputs)>;

/// fn(inputs), keeping only `inputs` for backward, which runs fn again with a graph and
/// backpropagates through it (reentrant activation checkpointing, torch.utils.checkpoint with
/// use_reentrant=True). Gradients reach the inputs and any parameters fn uses. Runs fn plainly
/// when no graph is being recorded or no input needs a gradient.
torch::Tensor checkpoint(const Recomputable& fn, const std::vector<torch::Tensor>& inputs);

/// An attention module whose core selective recomputation can checkpoint (set_recompute): its
/// forward calls attention(q, k, v), which is causal_attention, run through checkpoint() when
/// `recompute_core` is on, so that backward keeps q, k and v instead of the [B, heads, T, T]
/// softmax.
class CheckpointedAttention {
public:
  virtual ~CheckpointedAttention() = default;
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k,
                          const torch::Tensor& v) const;
  bool recompute_core = false;
};

/// Causal multi-head self-attention over q, k, v, out. The number of heads it runs is
/// q's output features / head_dim, so a column shard of q, k, v (whole heads) runs unchanged.
class CausalSelfAttentionImpl : public torch::nn::Module,
                                public LinearSlots,
                                public CheckpointedAttention,
                                public AttentionHeads {
public:
  CausalSelfAttentionImpl(int64_t hidden, int64_t heads, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;
  int64_t shard_granularity(const std::string& name) const override { return head_dim_; }
  int64_t head_dim() const override { return head_dim_; }

private:
  torch::nn::AnyModule& slot(const std::string& name);
  int64_t head_dim_;
  torch::nn::AnyModule q_, k_, v_, out_;
};
TORCH_MODULE(CausalSelfAttention);

/// The attention core both transformers share: softmax(q kᵀ / √d + causal mask) v, on
/// [B, heads, T, d] tensors (k and v with as many heads as q). The [B, heads, T, T] scores and
/// their softmax are kept for backward: the memory a fused (flash) kernel would not hold.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v);

/// fc (H -> F), exact GELU, proj (F -> H); F is 4H unless TransformerShape::ffn_hidden says.
class GptMlpImpl : public torch::nn::Module, public LinearSlots {
public:
  GptMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;

private:
  torch::nn::AnyModule fc_, proj_;
};
TORCH_MODULE(GptMlp);

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

/// x + attn(ln1(x)), then x + mlp(ln2(x)); optionally checkpointed (recompute in backward).
class GptBlockImpl : public torch::nn::Module, public CheckpointedBlock {
public:
  GptBlockImpl(int64_t hidden, int64_t heads, int64_t ffn,
               const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x) { return checkpointed(x); }
  torch::Tensor forward_plain(const torch::Tensor& x) override;

private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  GptMlp mlp_{nullptr};
};
TORCH_MODULE(GptBlock);

/// The head of a tied model: logits = x @ wte^T with the embedding's own wte. The weight is
/// not registered here, so parameters() lists it once (at embed.wte, as PyTorch does).
class TiedHeadImpl : public torch::nn::Module {
public:
  explicit TiedHeadImpl(GptEmbedding embed) : embed_(std::move(embed)) {}
  torch::Tensor forward(const torch::Tensor& x);

private:
  GptEmbedding embed_; // shared with the model's "embed" child, deliberately not a child here
};
TORCH_MODULE(TiedHead);

/// Builds the GPT with every parameter created by `tensors` (device and dtype), then (after
/// torch::manual_seed(seed) again, so construction draws do not matter) initializes in
/// parameters() order: LayerNorm weight 1 and bias 0, every other bias 0, every other weight
/// (wte, wpe, Linear weights) normal(0, 0.02). tests/models/reference_gpt.py does the same in
/// PyTorch. On the meta device there is nothing to initialize and nothing is drawn. Throws
/// std::invalid_argument for bad options.
torch::nn::Sequential build_gpt(const TransformerShape& options, uint64_t seed,
                                const torch::TensorOptions& tensors = {});

/// The GPT's MLP width: options.ffn_hidden, or 4H when it is 0.
int64_t gpt_ffn_hidden(const TransformerShape& options);

/// Parameters of the GPT for `options`, with F = gpt_ffn_hidden(options):
/// V*H + S*H + L*(4H^2 + 2HF + F + 9H) + 2H (+ V*H untied head); for F = 4H the block term is
/// 12H^2 + 13H.
int64_t gpt_parameter_count(const TransformerShape& options);

/// Sets what every transformer block of `model` (gpt's or llama's) recomputes in backward
/// (--recompute): Full checkpoints every CheckpointedBlock, Selective every attention core
/// (CheckpointedAttention), None neither.
void set_recompute(torch::nn::Sequential& model, Recompute recompute);

} // namespace meshsim
