// Multi-head latent attention (DeepSeek-V2, Liu et al. 2024; DeepSeek-V3): the projections of
// AttentionImpl when options.latent.kv_rank > 0 (attention.h). Per token:
//   q = q_b(q_a_norm(q_a(x)))           [heads, nope + rope]   (q(x) without q_rank)
//   c, k_rope = split(kv_a(x))          [kv_rank], [rope]      (k_rope: one for every head)
//   k_nope, v = split(kv_b(kv_a_norm(c))) [heads, nope], [heads, v_dim]
//   q = [q_nope, rotary(q_rope)], k = [k_nope, rotary(k_rope)]
// and the core runs on q, k, v as on any other heads. The two latent norms' epsilon is 1e-6 (the
// model's rms_norm_eps is the blocks' norms'), as DeepSeek's and Hugging Face's code builds them.
#include <cmath>

#include "models/device_layers.h"
#include "models/layers/attention.h"
#include "models/layers/rotary.h"

namespace meshsim {

namespace nn = torch::nn;

namespace {
constexpr double kLatentNormEps = 1e-6;
} // namespace

void AttentionImpl::build_latent(const torch::TensorOptions& t) {
  const AttentionOptions& o = options_;
  const LatentShape& l = o.latent; // checked by build_llama
  const int64_t q_features = o.heads * head_dim_;
  if (l.q_rank > 0) {
    q_a_ = nn::AnyModule(register_module("q_a", make_linear(o.hidden, l.q_rank, false, t)));
    q_a_norm_ = nn::AnyModule(register_module("q_a_norm", RmsNorm(l.q_rank, kLatentNormEps, t)));
    q_ = nn::AnyModule(register_module("q_b", make_linear(l.q_rank, q_features, false, t)));
  } else {
    q_ = nn::AnyModule(register_module("q", make_linear(o.hidden, q_features, false, t)));
  }
  kv_a_ = nn::AnyModule(
      register_module("kv_a", make_linear(o.hidden, l.kv_rank + l.rope_dim, false, t)));
  kv_a_norm_ =
      nn::AnyModule(register_module("kv_a_norm", RmsNorm(l.kv_rank, kLatentNormEps, t)));
  kv_b_ = nn::AnyModule(register_module(
      "kv_b", make_linear(l.kv_rank, o.heads * (l.nope_dim + l.v_dim), false, t)));
}

std::array<torch::Tensor, 3> AttentionImpl::latent_qkv(const torch::Tensor& x,
                                                       const torch::Tensor& positions) {
  const LatentShape& l = options_.latent;
  const int64_t b = x.size(0), t = x.size(1);
  const torch::Tensor q_in = q_a_.is_empty() ? x : q_a_norm_.forward(q_a_.forward(x));
  torch::Tensor q = q_.forward(q_in);
  const int64_t heads = q.size(2) / head_dim_;
  q = q.view({b, t, heads, head_dim_}).transpose(1, 2); // [B, heads, T, nope + rope]
  const torch::Tensor latent = kv_a_.forward(x);      // [B, T, kv_rank + rope]
  const torch::Tensor c = kv_a_norm_.forward(latent.narrow(-1, 0, l.kv_rank));
  torch::Tensor shared_key = latent.narrow(-1, l.kv_rank, l.rope_dim).unsqueeze(1);
  if (shared_key_region_) // tensor parallel: every member's heads add to its gradient
    shared_key = shared_key_region_(shared_key);
  const torch::Tensor k_rope = apply_rotary(shared_key, positions, options_.rope_theta,
                                            options_.rope_scaling, l.interleave); // [B, 1, T, rope]
  const torch::Tensor kv =
      kv_b_.forward(c).view({b, t, heads, l.nope_dim + l.v_dim}).transpose(1, 2);
  const torch::Tensor q_rope = apply_rotary(q.narrow(-1, l.nope_dim, l.rope_dim), positions,
                                            options_.rope_theta, options_.rope_scaling,
                                            l.interleave);
  // YaRN's softmax factor on q: the cores scale the scores by 1/sqrt(nope + rope) only.
  const double softmax = rope_softmax_factor(options_.rope_scaling);
  torch::Tensor q_out = torch::cat({q.narrow(-1, 0, l.nope_dim), q_rope}, -1);
  if (softmax != 1.0)
    q_out = q_out * softmax;
  torch::Tensor k = torch::cat(
      {kv.narrow(-1, 0, l.nope_dim), k_rope.expand({b, heads, t, l.rope_dim})}, -1);
  return {q_out, k, kv.narrow(-1, l.nope_dim, l.v_dim)};
}

} // namespace meshsim
