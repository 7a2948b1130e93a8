// Attention from its projections and its core.
#include "models/layers/attention.h"

#include <stdexcept>

#include "models/device_layers.h"
#include "models/layers/eager_core.h"
#include "models/layers/positions.h"
#include "models/layers/rotary.h"

namespace meshsim {

namespace nn = torch::nn;

AttentionImpl::AttentionImpl(const AttentionOptions& o, const torch::TensorOptions& t,
                             std::shared_ptr<const AttentionCore> core)
    : options_(o),
      head_dim_(o.latent.kv_rank > 0 ? o.latent.nope_dim + o.latent.rope_dim
                : o.head_dim > 0     ? o.head_dim
                                     : o.hidden / o.heads),
      core_(core ? std::move(core) : std::make_shared<EagerCausalCore>()) {
  const bool out_bias = o.out_bias < 0 ? o.bias : o.out_bias > 0;
  if (latent()) {
    build_latent(t);
    out_ = nn::AnyModule(register_module(
        o.out_name, make_linear(o.heads * o.latent.v_dim, o.hidden, out_bias, t)));
    return;
  }
  const int64_t kv = (o.kv_heads > 0 ? o.kv_heads : o.heads) * head_dim_;
  const int64_t inner = o.heads * head_dim_;
  q_ = nn::AnyModule(register_module("q", make_linear(o.hidden, inner, o.bias, t)));
  k_ = nn::AnyModule(register_module("k", make_linear(o.hidden, kv, o.bias, t)));
  v_ = nn::AnyModule(register_module("v", make_linear(o.hidden, kv, o.bias, t)));
  out_ = nn::AnyModule(register_module(o.out_name, make_linear(inner, o.hidden, out_bias, t)));
  if (o.qk_norm) {
    q_norm_ = nn::AnyModule(register_module("q_norm", RmsNorm(head_dim_, o.norm_eps, t)));
    k_norm_ = nn::AnyModule(register_module("k_norm", RmsNorm(head_dim_, o.norm_eps, t)));
  }
}

void AttentionImpl::set_core(std::shared_ptr<const AttentionCore> core) {
  core_ = core ? std::move(core) : std::make_shared<EagerCausalCore>();
}

torch::Tensor AttentionCore::forward_with_dropout(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v,
                                                  const torch::Tensor& positions,
                                                  const AttentionDropout& dropout) const {
  if (dropout.p > 0)
    throw std::invalid_argument("this attention core has no dropout on its probabilities");
  return forward(q, k, v, positions);
}

torch::Tensor sequence_positions(int64_t length, const torch::Tensor& like) {
  return arange_allocated(0, length, 1, like.options().dtype(torch::kLong));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& positions) {
  if (latent()) {
    const int64_t b = x.size(0), t = x.size(1);
    const torch::Tensor given = resolve_positions(positions, t);
    const torch::Tensor at = given.defined() ? given : sequence_positions(t, x);
    const auto [q, k, v] = latent_qkv(x, at);
    const torch::Tensor y = run_core(q, k, v, given, at).transpose(1, 2).contiguous();
    return out_.forward(y.view({b, t, y.size(2) * y.size(3)}));
  }
  // Op-level recomputation keeps q's and v's projections (the first and third matmul of the
  // block) and runs k's and the output projection again (keeps_linear, recompute.h).
  torch::Tensor q = run_linear("q", q_, x), k = run_linear("k", k_, x), v = run_linear("v", v_, x);
  // The whole sequence from q: under sequence parallelism x holds only part of it.
  const int64_t b = q.size(0), t = q.size(1), q_features = q.size(2), kv_features = k.size(2);
  // This member's heads when q, k, v are shards: whole heads, the same share of each kind.
  const int64_t heads = q_features / head_dim_, kv_heads = kv_features / head_dim_;
  if (q_features % head_dim_ != 0 || kv_features % head_dim_ != 0 || kv_heads == 0 ||
      heads % kv_heads != 0)
    throw std::invalid_argument(
        "attention: q has " + std::to_string(q_features) + " and k " + std::to_string(kv_features) +
        " features, not whole groups of heads of " + std::to_string(head_dim_));
  const torch::Tensor given = resolve_positions(positions, t); // explicit, or the scope's
  const torch::Tensor at = given.defined() ? given : sequence_positions(t, q);
  auto split = [&](const torch::Tensor& y, int64_t n) {
    return y.view({b, t, n, head_dim_}).transpose(1, 2); // [B, n, T, head_dim]
  };
  q = split(q, heads);
  k = split(k, kv_heads);
  v = split(v, kv_heads);
  if (options_.qk_norm) {
    q = q_norm_.forward(q);
    k = k_norm_.forward(k);
  }
  if (options_.rope_theta > 0) {
    q = apply_rotary(q, at, options_.rope_theta, options_.rope_scaling);
    k = apply_rotary(k, at, options_.rope_theta, options_.rope_scaling);
  }
  if (kv_heads != heads && !core_->takes_grouped_kv()) { // kv head j serves query heads j·group .. (j+1)·group - 1
    const int64_t group = heads / kv_heads;
    const auto repeat = [&](const torch::Tensor& y) {
      return y.unsqueeze(2)
          .expand({b, kv_heads, group, t, head_dim_})
          .reshape({b, heads, t, head_dim_});
    };
    k = repeat(k);
    v = repeat(v);
  }
  torch::Tensor y =
      run_core(q, k, v, given, at).transpose(1, 2).contiguous().view({b, t, q_features});
  return out_.forward(y);
}

torch::Tensor AttentionImpl::run_core(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const torch::Tensor& given,
                                      const torch::Tensor& positions) const {
  // Dropout on the probabilities in training only; its masks are a function of the draw
  // (which a checkpoint's recompute reinstalls), so the recompute draws the same.
  // A core op-level recomputation does not keep (kept_under_op) keeps nothing of what it
  // calls either: it runs again in the recompute.
  const KeptOutputsScope keeping(core_->kept_under_op() ? current_kept_outputs() : nullptr);
  AttentionDropout dropout;
  dropout.p = is_training() ? options_.dropout : 0.0;
  dropout.layer = options_.layer;
  dropout.first_head = first_head_;
  if (dropout.p > 0)
    dropout.draw = current_dropout_draw();
  if (!recompute_core || !core_recomputable())
    return dropout.p > 0 ? core_->forward_with_dropout(q, k, v, positions, dropout)
                         : core_->forward(q, k, v, positions);
  // Selective recomputation: backward keeps q, k, v, not what the core saves. Positions
  // 0..T-1 (none given) are made again in the recompute, as the mask is, so nothing more is
  // kept; given positions are kept. The core outlives the graph (the model owns it through
  // this module).
  const AttentionCore* core = core_.get();
  return checkpoint(
      [core, given, dropout](const std::vector<torch::Tensor>& in) {
        const torch::Tensor at = given.defined() ? given : sequence_positions(in[0].size(2), in[0]);
        return dropout.p > 0 ? core->forward_with_dropout(in[0], in[1], in[2], at, dropout)
                             : core->forward(in[0], in[1], in[2], at);
      },
      {q, k, v});
}

int64_t AttentionImpl::query_features() const {
  const torch::Tensor w = slot_weight(*q_.ptr());
  return w.defined() ? w.size(0) : options_.heads * head_dim_;
}

void AttentionImpl::add_elementwise_work(LayerWork& total, double /*rows*/, double gathered,
                                         double /*width*/, double eb) const {
  if (options_.rope_theta <= 0 || latent())
    return;
  const torch::Tensor k = slot_weight(*k_.ptr());
  // q and k rotated, x·cos + rotate(x)·sin: one kernel each fused; eager, apply_rotary's five
  // ops on x's n elements (cos and sin, [T, head_dim], are left out).
  const auto rotate = [&](double n) {
    if (!eager_kernels()) {
      add_elementwise(total, n, 3, 1, 1, eb);
      return;
    }
    add_elementwise(total, n, 1, 1, 1, eb);     // x · cos
    add_elementwise(total, n / 2, 1, 1, 1, eb); // -x's second half
    add_elementwise(total, n, 0, 1, 1, eb);     // cat: rotate_half(x)
    add_elementwise(total, n, 1, 1, 1, eb);     // · sin
    add_elementwise(total, n, 1, 2, 1, eb);     // the sum
  };
  rotate(gathered * static_cast<double>(query_features()));
  if (k.defined())
    rotate(gathered * static_cast<double>(k.size(0)));
}

int64_t AttentionImpl::value_features() const {
  if (!latent())
    return query_features();
  return query_features() / head_dim_ * options_.latent.v_dim;
}

int64_t AttentionImpl::shard_granularity(const std::string& name) const {
  if (latent() && name == "kv_b")
    return options_.latent.nope_dim + options_.latent.v_dim; // k_nope and v, per head
  if (latent() && name == options_.out_name)
    return options_.latent.v_dim;
  return head_dim_;
}

std::string AttentionImpl::slot_input(const std::string& name) const {
  return latent() && (name == "q_b" || name == "kv_b") ? name : "";
}

nn::AnyModule& AttentionImpl::slot(const std::string& name) {
  if (latent()) {
    const std::string q_name = q_a_.is_empty() ? "q" : "q_b";
    if (name == q_name)
      return q_;
    if (name == "kv_b")
      return kv_b_;
    if (name == options_.out_name)
      return out_;
    throw std::invalid_argument("latent attention has no tensor-parallel linear '" + name +
                                "' (" + q_name + ", kv_b, " + options_.out_name + ")");
  }
  if (name == "q")
    return q_;
  if (name == "k")
    return k_;
  if (name == "v")
    return v_;
  if (name == options_.out_name)
    return out_;
  throw std::invalid_argument("attention has no linear '" + name + "' (q, k, v, " +
                              options_.out_name + ")");
}

void AttentionImpl::replace_linear(const std::string& name, nn::AnyModule module) {
  nn::AnyModule& holder = slot(name);
  replace_module(name, module.ptr());
  holder = std::move(module);
}

} // namespace meshsim
