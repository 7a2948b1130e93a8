// The Llama's modules, its build and init, and its parameter count.
#include "models/llama.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_set>

#include "models/device_layers.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;

constexpr double kRmsNormEps = 1e-5;

bool low_precision(torch::ScalarType t) {
  return t == torch::kBFloat16 || t == torch::kHalf;
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

} // namespace

LlamaEmbeddingImpl::LlamaEmbeddingImpl(int64_t vocab, int64_t hidden, int64_t seq_len,
                                       const torch::TensorOptions& t)
    : seq_len_(seq_len) {
  wte = register_parameter("wte", torch::empty({vocab, hidden}, t));
}

torch::Tensor LlamaEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(1) > seq_len_)
    throw std::invalid_argument("llama: expected tokens [B,T] with T <= " +
                                std::to_string(seq_len_) + ", got " + c10::str(tokens.sizes()));
  return nn::functional::embedding(tokens, wte);
}

RmsNormImpl::RmsNormImpl(int64_t width, double eps, const torch::TensorOptions& t) : eps_(eps) {
  torch::Tensor w = torch::empty({width}, t);
  if (!w.is_meta())
    w.fill_(1.0);
  weight = register_parameter("weight", w);
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = low_precision(x.scalar_type()) ? x.to(torch::kFloat32) : x;
  const torch::Tensor normed = h * torch::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

torch::Tensor apply_rotary(const torch::Tensor& x, double theta) {
  const int64_t t = x.size(-2), d = x.size(-1);
  // The angles in float32 at least (bf16 would round the positions themselves), then in x's
  // dtype, as Hugging Face's Llama casts cos and sin.
  const auto compute =
      x.options().dtype(low_precision(x.scalar_type()) ? torch::kFloat32 : x.scalar_type());
  const torch::Tensor inv_freq =
      1.0 / torch::pow(theta, torch::arange(0, d, 2, compute) / static_cast<double>(d));
  const torch::Tensor angles = torch::outer(torch::arange(t, compute), inv_freq); // [T, d/2]
  const torch::Tensor emb = torch::cat({angles, angles}, -1);                     // [T, d]
  const torch::Tensor cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
  return x * cos + rotate_half(x) * sin;
}

LlamaAttentionImpl::LlamaAttentionImpl(int64_t hidden, int64_t heads, int64_t kv_heads,
                                       double rope_theta, const torch::TensorOptions& t)
    : head_dim_(hidden / heads), rope_theta_(rope_theta) {
  const int64_t kv = kv_heads * head_dim_;
  q_ = nn::AnyModule(register_module("q", make_linear(hidden, heads * head_dim_, false, t)));
  k_ = nn::AnyModule(register_module("k", make_linear(hidden, kv, false, t)));
  v_ = nn::AnyModule(register_module("v", make_linear(hidden, kv, false, t)));
  o_ = nn::AnyModule(register_module("o", make_linear(heads * head_dim_, hidden, false, t)));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  torch::Tensor q = q_.forward(x), k = k_.forward(x), v = v_.forward(x);
  // The whole sequence from q: under sequence parallelism x holds only part of it.
  const int64_t b = q.size(0), t = q.size(1), q_features = q.size(2), kv_features = k.size(2);
  // This member's heads when q, k, v are shards: whole heads, the same share of each kind.
  const int64_t heads = q_features / head_dim_, kv_heads = kv_features / head_dim_;
  if (q_features % head_dim_ != 0 || kv_features % head_dim_ != 0 || kv_heads == 0 ||
      heads % kv_heads != 0)
    throw std::invalid_argument("llama attention: q has " + std::to_string(q_features) + " and k " +
                                std::to_string(kv_features) +
                                " features, not whole groups of heads of " +
                                std::to_string(head_dim_));
  auto split = [&](const torch::Tensor& y, int64_t n) {
    return y.view({b, t, n, head_dim_}).transpose(1, 2); // [B, n, T, head_dim]
  };
  q = apply_rotary(split(q, heads), rope_theta_);
  k = apply_rotary(split(k, kv_heads), rope_theta_);
  v = split(v, kv_heads);
  if (kv_heads != heads) { // kv head j serves query heads j·group .. (j+1)·group - 1
    const int64_t group = heads / kv_heads;
    const auto repeat = [&](const torch::Tensor& y) {
      return y.unsqueeze(2)
          .expand({b, kv_heads, group, t, head_dim_})
          .reshape({b, heads, t, head_dim_});
    };
    k = repeat(k);
    v = repeat(v);
  }
  torch::Tensor y = attention(q, k, v).transpose(1, 2).contiguous().view({b, t, q_features});
  return o_.forward(y);
}

int64_t LlamaAttentionImpl::shard_granularity(const std::string&) const {
  return head_dim_;
}

nn::AnyModule& LlamaAttentionImpl::slot(const std::string& name) {
  if (name == "q")
    return q_;
  if (name == "k")
    return k_;
  if (name == "v")
    return v_;
  if (name == "o")
    return o_;
  throw std::invalid_argument("llama attention has no linear '" + name + "' (q, k, v, o)");
}

void LlamaAttentionImpl::replace_linear(const std::string& name, nn::AnyModule module) {
  nn::AnyModule& holder = slot(name);
  replace_module(name, module.ptr());
  holder = std::move(module);
}

SwiGluMlpImpl::SwiGluMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& t) {
  gate_ = nn::AnyModule(register_module("gate", make_linear(hidden, ffn, false, t)));
  up_ = nn::AnyModule(register_module("up", make_linear(hidden, ffn, false, t)));
  down_ = nn::AnyModule(register_module("down", make_linear(ffn, hidden, false, t)));
}

torch::Tensor SwiGluMlpImpl::forward(const torch::Tensor& x) {
  return down_.forward(nn::functional::silu(gate_.forward(x)) * up_.forward(x));
}

void SwiGluMlpImpl::replace_linear(const std::string& name, nn::AnyModule module) {
  nn::AnyModule* holder = name == "gate"   ? &gate_
                          : name == "up"   ? &up_
                          : name == "down" ? &down_
                                           : nullptr;
  if (!holder)
    throw std::invalid_argument("mlp has no linear '" + name + "' (gate, up, down)");
  replace_module(name, module.ptr());
  *holder = std::move(module);
}

LlamaBlockImpl::LlamaBlockImpl(const TransformerShape& o, const torch::TensorOptions& t) {
  attn_norm_ = register_module("attn_norm", RmsNorm(o.hidden, kRmsNormEps, t));
  attn_ = register_module("attn",
                          LlamaAttention(o.hidden, o.heads, llama_kv_heads(o), o.rope_theta, t));
  mlp_norm_ = register_module("mlp_norm", RmsNorm(o.hidden, kRmsNormEps, t));
  mlp_ = register_module("mlp", SwiGluMlp(o.hidden, llama_ffn_hidden(o), t));
}

torch::Tensor LlamaBlockImpl::forward_plain(const torch::Tensor& x) {
  torch::Tensor h = x + attn_->forward(attn_norm_->forward(x));
  return h + mlp_->forward(mlp_norm_->forward(h));
}

int64_t llama_ffn_hidden(const TransformerShape& o) {
  if (o.ffn_hidden > 0)
    return o.ffn_hidden;
  const int64_t two_thirds = 8 * o.hidden / 3; // int(2 · 4H / 3), as Meta's code
  return 256 * ((two_thirds + 255) / 256);     // up to a multiple of 256
}

int64_t llama_kv_heads(const TransformerShape& o) {
  return o.kv_heads > 0 ? o.kv_heads : o.heads;
}

torch::nn::Sequential build_llama(const TransformerShape& o, uint64_t seed,
                                  const torch::TensorOptions& t) {
  if (o.layers < 1 || o.hidden < 1 || o.heads < 1 || o.seq_len < 1 || o.vocab < 1 ||
      o.kv_heads < 0 || o.ffn_hidden < 0 || !(o.rope_theta > 0))
    throw std::invalid_argument("llama: layers, hidden, heads, seq_len, vocab and rope_theta must "
                                "be positive (kv_heads and ffn_hidden positive or 0)");
  if (o.hidden % o.heads != 0 || (o.hidden / o.heads) % 2 != 0)
    throw std::invalid_argument("llama: hidden " + std::to_string(o.hidden) + " is not heads (" +
                                std::to_string(o.heads) +
                                ") times an even head size (rotary embeddings rotate pairs)");
  if (o.heads % llama_kv_heads(o) != 0)
    throw std::invalid_argument("llama: heads " + std::to_string(o.heads) +
                                " is not divisible by kv_heads " + std::to_string(o.kv_heads));
  if (o.tie_head)
    throw std::invalid_argument("llama: the head is untied (no --tie-head)");
  nn::Sequential model;
  model->push_back("embed", LlamaEmbedding(o.vocab, o.hidden, o.seq_len, t));
  for (int64_t l = 0; l < o.layers; ++l)
    model->push_back("block" + std::to_string(l), LlamaBlock(o, t));
  model->push_back("norm_f", RmsNorm(o.hidden, kRmsNormEps, t));
  model->push_back("head", make_linear(o.hidden, o.vocab, false, t));
  if (t.device().is_meta())
    return model; // shapes only: nothing to initialize

  std::unordered_set<const void*> norms;
  for (const auto& m : model->modules(/*include_self=*/false))
    if (const auto* norm = m->as<RmsNormImpl>())
      norms.insert(norm->weight.unsafeGetTensorImpl());
  torch::manual_seed(seed); // the init is independent of what the constructors drew
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters())
    norms.count(p.unsafeGetTensorImpl()) ? p.fill_(1.0) : p.normal_(0.0, kInitStd);
  return model;
}

int64_t llama_parameter_count(const TransformerShape& o) {
  const int64_t h = o.hidden, d = o.hidden / o.heads, kv = llama_kv_heads(o);
  const int64_t f = llama_ffn_hidden(o);
  // q and o: H², k and v: H·K·d each; gate, up, down: H·F each; two RMSNorms: H each.
  const int64_t block = 2 * h * h + 2 * h * kv * d + 3 * h * f + 2 * h;
  return o.vocab * h + o.layers * block + h + o.vocab * h;
}

} // namespace meshsim
