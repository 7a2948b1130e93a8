// The Llama's embedding and block (from the layers' slots), its build and init, and its
// parameter count.
#include "models/llama.h"

#include <stdexcept>
#include <unordered_set>

#include "models/device_layers.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;

AttentionOptions llama_attention(const TransformerShape& o, int64_t layer) {
  AttentionOptions a{o.hidden, o.heads,      llama_kv_heads(o), o.qkv_bias,
                     "o",      o.rope_theta, o.dropout,         layer};
  a.head_dim = llama_head_dim(o);
  a.out_bias = o.out_bias ? 1 : 0;
  a.qk_norm = o.qk_norm;
  a.norm_eps = o.norm_eps;
  a.rope_scaling = o.rope_scaling;
  a.latent = o.latent;
  return a;
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
  return sum_ ? sum_(lookup_vocab_range(tokens, wte, first_)) : nn::functional::embedding(tokens, wte);
}

void LlamaEmbeddingImpl::split_vocabulary(int64_t first, int64_t rows,
                                          std::function<torch::Tensor(const torch::Tensor&)> sum) {
  keep_vocabulary_rows(wte, first, rows);
  first_ = first;
  sum_ = std::move(sum);
}

LlamaBlockImpl::LlamaBlockImpl(const TransformerShape& o, const torch::TensorOptions& t,
                               int64_t layer)
    : PreNormBlockImpl(BlockParts{
          "attn_norm", "mlp_norm", nn::AnyModule(RmsNorm(o.hidden, o.norm_eps, t)),
          nn::AnyModule(RmsNorm(o.hidden, o.norm_eps, t)), Attention(llama_attention(o, layer), t),
          llama_feed_forward(o, layer, t), o.dropout, layer}) {}

std::shared_ptr<FeedForward> llama_feed_forward(const TransformerShape& o, int64_t layer,
                                                const torch::TensorOptions& t) {
  if (llama_moe_layer(o, layer))
    return Moe(llama_moe_options(o), t).ptr();
  return SwiGluMlp(o.hidden, llama_ffn_hidden(o), t).ptr();
}

bool llama_moe_layer(const TransformerShape& o, int64_t layer) {
  return o.moe.experts > 0 && layer >= o.moe.dense_layers;
}

MoeOptions llama_moe_options(const TransformerShape& o) {
  MoeOptions m;
  m.hidden = o.hidden;
  m.experts = o.moe.experts;
  m.top_k = o.moe.top_k;
  m.expert_ffn = o.moe.ffn > 0 ? o.moe.ffn : llama_ffn_hidden(o);
  m.shared_ffn = o.moe.shared_ffn;
  m.router = parse_moe_router(o.moe.router);
  m.normalize_top_k = o.moe.normalize;
  m.routed_scale = o.moe.routed_scale;
  m.groups = o.moe.groups;
  m.top_groups = o.moe.top_groups;
  m.aux_loss = o.moe.aux_loss;
  m.capacity_factor = o.moe.capacity_factor;
  m.planned_shares = o.moe.planned_shares;
  return m;
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

int64_t llama_head_dim(const TransformerShape& o) {
  return o.head_dim > 0 ? o.head_dim : o.hidden / o.heads;
}

torch::nn::Sequential build_llama(const TransformerShape& o, uint64_t seed,
                                  const torch::TensorOptions& t) {
  if (o.layers < 1 || o.hidden < 1 || o.heads < 1 || o.seq_len < 1 || o.vocab < 1 ||
      o.kv_heads < 0 || o.ffn_hidden < 0 || o.head_dim < 0 || !(o.rope_theta > 0) ||
      !(o.norm_eps > 0))
    throw std::invalid_argument("llama: layers, hidden, heads, seq_len, vocab, rope_theta and "
                                "norm_eps must be positive (kv_heads, ffn_hidden and head_dim "
                                "positive or 0)");
  if (o.head_dim > 0 && o.head_dim % 2 != 0)
    throw std::invalid_argument("llama: head_dim " + std::to_string(o.head_dim) +
                                " is odd (rotary embeddings rotate pairs)");
  if (o.head_dim == 0 && (o.hidden % o.heads != 0 || (o.hidden / o.heads) % 2 != 0))
    throw std::invalid_argument("llama: hidden " + std::to_string(o.hidden) + " is not heads (" +
                                std::to_string(o.heads) +
                                ") times an even head size (rotary embeddings rotate pairs)");
  if (o.latent.kv_rank > 0 &&
      (o.latent.rope_dim < 2 || o.latent.rope_dim % 2 != 0 || o.latent.v_dim < 1 ||
       o.latent.nope_dim < 0 || o.latent.q_rank < 0))
    throw std::invalid_argument("llama: latent attention needs an even rope_dim and a positive "
                                "v_dim (q_rank and nope_dim positive or 0)");
  if (o.heads % llama_kv_heads(o) != 0)
    throw std::invalid_argument("llama: heads " + std::to_string(o.heads) +
                                " is not divisible by kv_heads " + std::to_string(o.kv_heads));
  nn::Sequential model;
  LlamaEmbedding embed(o.vocab, o.hidden, o.seq_len, t);
  model->push_back("embed", embed);
  for (int64_t l = 0; l < o.layers; ++l)
    model->push_back("block" + std::to_string(l), LlamaBlock(o, t, l));
  model->push_back("norm_f", RmsNorm(o.hidden, o.norm_eps, t));
  if (o.tie_head) // tie_word_embeddings: the head reads the embedding's wte
    model->push_back("head", TiedHead(nn::AnyModule(embed), &embed->wte));
  else
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

namespace {

// One block's attention: q and o H·heads·d each, k and v H·K·d each, with their biases if any,
// q_norm and k_norm d each; or multi-head latent attention's projections and its two norms.
int64_t llama_attention_parameters(const TransformerShape& o) {
  const int64_t h = o.hidden;
  if (o.latent.kv_rank > 0) {
    const LatentShape& l = o.latent;
    const int64_t q_width = o.heads * (l.nope_dim + l.rope_dim);
    const int64_t q = l.q_rank > 0 ? h * l.q_rank + l.q_rank + l.q_rank * q_width : h * q_width;
    const int64_t kv = h * (l.kv_rank + l.rope_dim) + l.kv_rank +
                       l.kv_rank * o.heads * (l.nope_dim + l.v_dim);
    return q + kv + o.heads * l.v_dim * h + (o.out_bias ? h : 0);
  }
  const int64_t d = llama_head_dim(o), kv = llama_kv_heads(o), q = o.heads * d;
  const int64_t biases = (o.qkv_bias ? q + 2 * kv * d : 0) + (o.out_bias ? h : 0);
  return 2 * h * q + 2 * h * kv * d + biases + (o.qk_norm ? 2 * d : 0);
}

} // namespace

int64_t llama_parameter_count(const TransformerShape& o) {
  const int64_t h = o.hidden, f = llama_ffn_hidden(o);
  // Attention, two RMSNorms of H, and a dense MLP's gate, up, down (H·F each) or an MoE
  // layer's (moe_parameter_count).
  const int64_t block = llama_attention_parameters(o) + 2 * h;
  const int64_t moe = o.moe.experts > 0 ? moe_parameter_count(llama_moe_options(o)) : 0;
  int64_t feed_forward = 0;
  for (int64_t l = 0; l < o.layers; ++l)
    feed_forward += llama_moe_layer(o, l) ? moe : 3 * h * f;
  return o.vocab * h + o.layers * block + feed_forward + h + (o.tie_head ? 0 : o.vocab * h);
}

int64_t llama_active_parameter_count(const TransformerShape& o) {
  int64_t idle = 0;
  if (o.moe.experts > 0) {
    const MoeOptions m = llama_moe_options(o);
    for (int64_t l = 0; l < o.layers; ++l)
      if (llama_moe_layer(o, l))
        idle += (m.experts - m.top_k) * 3 * m.hidden * m.expert_ffn;
  }
  return llama_parameter_count(o) - idle;
}

} // namespace meshsim
