// Attention made of slots: the projections q, k, v and out (Linears that tensor parallelism
// may replace, LinearSlots) around a core (AttentionCore) that runs the attention itself on
// per-head q, k, v at explicit token positions. Today's core is the eager causal one
// (eager_core.h); a fused (flash) core, or a context-parallel one whose rank holds
// non-contiguous chunks of the sequence, is another AttentionCore in a sibling file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "models/layers/flops.h"
#include "models/layers/recompute.h"
#include "models/layers/slots.h"

namespace meshsim {

/// The part of attention after the projections. q [B, heads, T, d]; k and v with as many
/// heads as q (grouped-query attention has repeated them already); positions int64 [T], the
/// place in the whole sequence of each of the T tokens (the causal mask and any position
/// encoding read them, never the index within T). Returns [B, heads, T, d].
class AttentionCore {
public:
  virtual ~AttentionCore() = default;
  virtual torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& positions) const = 0;
  /// True for a core that takes k and v with their own kv heads (not repeated to q's) and
  /// repeats them itself: a context-parallel core sends them over the network first.
  virtual bool takes_grouped_kv() const { return false; }
  /// Each query's keys span this many times the T tokens it is given (context parallelism:
  /// the cp group's whole sequence); what the FLOP counts read.
  virtual int64_t context_parts() const { return 1; }
};

struct AttentionOptions {
  int64_t hidden = 0, heads = 0;
  int64_t kv_heads = 0;         // key/value heads (grouped-query attention); 0: heads
  bool bias = true;             // biases on q, k, v and out
  std::string out_name = "out"; // the output projection's child name ("o" in Llama)
  double rope_theta = 0;        // rotary embedding of q and k at the positions; 0: none
};

/// Self-attention: q [H -> heads·d], k and v [H -> kv_heads·d], out [heads·d -> H], then
/// the core. Each kv head serves heads/kv_heads consecutive query heads. The heads it runs
/// are read from q's and k's output features, so a column shard of whole heads (heads/tp
/// query and kv_heads/tp kv heads) runs unchanged. Children: q, k, v, out (parameters in
/// that order); the core holds no parameters and is no child.
class AttentionImpl : public torch::nn::Module,
                      public LinearSlots,
                      public CheckpointedAttention,
                      public AttentionHeads {
public:
  /// `core`: nullptr for the eager causal core.
  AttentionImpl(const AttentionOptions& options, const torch::TensorOptions& tensors = {},
                std::shared_ptr<const AttentionCore> core = nullptr);
  /// x [B, T', H] (T' = T, or this member's part of it under sequence parallelism) ->
  /// [B, T', H]. `positions` [T] of the tokens q sees; undefined: the PositionsScope's
  /// (models/layers/positions.h), or outside one 0..T-1, the whole sequence.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions = {});
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;
  int64_t shard_granularity(const std::string&) const override { return head_dim_; }
  int64_t head_dim() const override { return head_dim_; }
  int64_t query_features() const override;
  const AttentionCore& core() const { return *core_; }
  /// Replaces the core (context parallelism installs its own in every attention module).
  void set_core(std::shared_ptr<const AttentionCore> core);
  int64_t context_parts() const override { return core_->context_parts(); }

private:
  torch::nn::AnyModule& slot(const std::string& name);
  // The core at `positions`; `given` is what the caller passed (undefined: 0..T-1).
  torch::Tensor run_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& given, const torch::Tensor& positions) const;
  AttentionOptions options_;
  int64_t head_dim_;
  std::shared_ptr<const AttentionCore> core_;
  torch::nn::AnyModule q_, k_, v_, out_;
};
TORCH_MODULE(Attention);

/// The positions of a whole sequence of `length` tokens, 0..length-1 (int64, on `like`'s
/// device): what a model that holds every token passes down.
torch::Tensor sequence_positions(int64_t length, const torch::Tensor& like);

} // namespace meshsim
