// Attention made of slots: the projections q, k, v and out (Linears that tensor parallelism
// may replace, LinearSlots) around a core (AttentionCore) that runs the attention itself on
// per-head q, k, v at explicit token positions. The cores: the eager causal one
// (eager_core.h), which keeps the [B, heads, T, T] softmax for backward, and the fused one
// (fused_core.h, --attention fused, the default of train and plan), which keeps none; a
// context-parallel one whose rank holds non-contiguous chunks of the sequence is another
// AttentionCore in a sibling file.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "models/layers/dropout.h"
#include "models/layers/flops.h"
#include "models/layers/norms.h"
#include "models/layers/recompute.h"
#include "models/layers/rotary.h"
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
  /// Runs as one fused kernel (fused_core.h): its [B, heads, T, T] scores never reach memory
  /// and backward recomputes them, so there is nothing for selective recomputation to drop,
  /// and the FLOP counts add that recompute instead of the scores' traffic (flops.h).
  virtual bool fused() const { return false; }
  /// forward() with dropout on the probabilities, masks from attention_dropout_keep
  /// (models/layers/dropout.h) at the current draw's samples. A core without dropout throws
  /// std::invalid_argument for dropout.p > 0.
  virtual torch::Tensor forward_with_dropout(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v,
                                             const torch::Tensor& positions,
                                             const AttentionDropout& dropout) const;
  /// True for a core that takes k and v with their own kv heads (not repeated to q's) and
  /// repeats them itself: a context-parallel core sends them over the network first.
  virtual bool takes_grouped_kv() const { return false; }
  /// Each query's keys span this many times the T tokens it is given (context parallelism:
  /// the cp group's whole sequence); what the FLOP counts read.
  virtual int64_t context_parts() const { return 1; }
  /// Whether op-level recomputation keeps this core's output (models/layers/recompute.h): a
  /// fused core hands its kept output and log-sum-exp to its recompute, which runs only the
  /// backward; another core runs again.
  virtual bool kept_under_op() const { return fused(); }
};

struct AttentionOptions {
  int64_t hidden = 0, heads = 0;
  int64_t kv_heads = 0;         // key/value heads (grouped-query attention); 0: heads
  bool bias = true;             // biases on q, k, v and out
  std::string out_name = "out"; // the output projection's child name ("o" in Llama)
  double rope_theta = 0;        // rotary embedding of q and k at the positions; 0: none
  double dropout = 0;           // on the probabilities, in training (attention_dropout)
  int64_t layer = 0;            // the block's index in the whole model (dropout's masks)
  int64_t head_dim = 0;         // each head's width; 0: hidden / heads
  int out_bias = -1;            // a bias on out: 1 yes, 0 no, -1 as `bias`
  bool qk_norm = false;         // RMSNorm q_norm, k_norm over each head's width, before rotary
  double norm_eps = 1e-5;       // their epsilon
  RopeScaling rope_scaling{};   // of the rotary frequencies (rotary.h)
  LatentShape latent{};         // multi-head latent attention; kv_rank 0: q, k, v projections
};

/// Self-attention: q [H -> heads·d], k and v [H -> kv_heads·d], out [heads·d -> H], then
/// the core; with qk_norm, q and k are RMS-normalised per head (one weight of d shared by the
/// heads, Qwen3's q_norm and k_norm) before their rotation. Each kv head serves heads/kv_heads
/// consecutive query heads. The heads it runs are read from q's and k's output features, so a
/// column shard of whole heads (heads/tp query and kv_heads/tp kv heads) runs unchanged. Children:
/// q, k, v, out (parameters in that order; then q_norm, k_norm); the core holds no parameters and
/// is no child.
///
/// With options.latent.kv_rank > 0 it is multi-head latent attention (DeepSeek-V2/V3,
/// latent_attention.cpp): children q_a, q_a_norm, q_b (or q when q_rank is 0), kv_a, kv_a_norm,
/// kv_b and out, in that order, as Hugging Face's DeepseekV3Attention. q_b gives each head
/// nope_dim + rope_dim features, kv_a the kv_rank latent and one rope_dim key part that every
/// head shares, kv_b each head's nope_dim key and v_dim value features; the cores take q and k
/// nope_dim + rope_dim wide and v v_dim wide, the softmax's scale 1/sqrt(nope_dim + rope_dim)
/// times YaRN's rope_softmax_factor (rotary.h). Under tensor parallelism q_b (or q) and kv_b are
/// column-parallel by whole heads and out row-parallel; q_a and kv_a stay whole, and the rotated
/// key part, which every head reads, passes set_shared_key_region's function (the sum of its
/// gradient over the group).
class AttentionImpl : public torch::nn::Module,
                      public LinearSlots,
                      public CheckpointedAttention,
                      public KeepsLinears,
                      public AttentionHeads,
                      public ElementwiseWork {
public:
  /// `core`: nullptr for the eager causal core (build_model installs ModelOptions::attention's).
  AttentionImpl(const AttentionOptions& options, const torch::TensorOptions& tensors = {},
                std::shared_ptr<const AttentionCore> core = nullptr);
  /// x [B, T', H] (T' = T, or this member's part of it under sequence parallelism) ->
  /// [B, T', H]. `positions` [T] of the tokens q sees; undefined: the PositionsScope's
  /// (models/layers/positions.h), or outside one 0..T-1, the whole sequence.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions = {});
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;
  int64_t shard_granularity(const std::string& name) const override;
  std::string slot_input(const std::string& name) const override;
  /// Latent attention under tensor parallelism: applied to the rotated key part every head
  /// reads (identity forward, its gradient summed over the group in backward).
  void set_shared_key_region(std::function<torch::Tensor(const torch::Tensor&)> region) {
    shared_key_region_ = std::move(region);
  }
  int64_t head_dim() const override { return head_dim_; }
  int64_t query_features() const override;
  int64_t value_features() const override;
  bool latent() const { return options_.latent.kv_rank > 0; }
  const AttentionCore& core() const { return *core_; }
  /// Replaces the core (nullptr: the eager one); models.cpp installs --attention's.
  void set_core(std::shared_ptr<const AttentionCore> core);
  bool fused_core() const override { return core_->fused(); }
  bool core_kept_under_op() const override { return core_->kept_under_op(); }
  bool core_recomputable() const override { return !core_->fused(); }
  /// Op-level recomputation keeps the query and value projections' outputs (not latent
  /// attention's).
  bool keeps_linear(const std::string& name) const override {
    return !latent() && (name == "q" || name == "v");
  }
  /// The global index of this module's first head: tensor parallelism sets it on a shard of
  /// whole heads, so its dropout masks are those of the same heads on one device.
  void set_first_head(int64_t head) { first_head_ = head; }
  int64_t context_parts() const override { return core_->context_parts(); }
  /// The rotation of q and k (with rope_theta; latent attention's rotated parts are not
  /// counted), on the rows its Linears see (flops.h).
  void add_elementwise_work(LayerWork& total, double rows, double gathered, double width,
                            double eb) const override;

private:
  torch::nn::AnyModule& slot(const std::string& name);
  // Multi-head latent attention (latent_attention.cpp): its children, and q, k, v [B, heads, T,
  // d] from x [B, T, H] at `positions`, rotated.
  void build_latent(const torch::TensorOptions& tensors);
  std::array<torch::Tensor, 3> latent_qkv(const torch::Tensor& x, const torch::Tensor& positions);
  // The core at `positions`; `given` is what the caller passed (undefined: 0..T-1).
  torch::Tensor run_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& given, const torch::Tensor& positions) const;
  AttentionOptions options_;
  int64_t head_dim_;
  int64_t first_head_ = 0;
  std::shared_ptr<const AttentionCore> core_;
  torch::nn::AnyModule q_, k_, v_, out_;
  torch::nn::AnyModule q_norm_, k_norm_; // empty without qk_norm
  // Multi-head latent attention's (q_ is q_b, or q without q_rank; k_ and v_ stay empty).
  torch::nn::AnyModule q_a_, q_a_norm_, kv_a_, kv_a_norm_, kv_b_;
  std::function<torch::Tensor(const torch::Tensor&)> shared_key_region_;
};
TORCH_MODULE(Attention);

/// The positions of a whole sequence of `length` tokens, 0..length-1 (int64, on `like`'s
/// device): what a model that holds every token passes down.
torch::Tensor sequence_positions(int64_t length, const torch::Tensor& like);

} // namespace meshsim
