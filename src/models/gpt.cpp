// The GPT's modules (its embedding, its block from the layers' slots, the tied head), its
// build and init, and its parameter count.
#include "models/gpt.h"

#include <stdexcept>

#include "models/device_layers.h"
#include "models/layers/positions.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;

bool is_layer_norm_parameter(const std::string& name) {
  // "...ln1.weight", "ln_f.bias": the module's own name starts with "ln".
  const auto end = name.rfind('.');
  const auto begin = name.rfind('.', end - 1);
  const std::string module = name.substr(begin == std::string::npos ? 0 : begin + 1,
                                         end - (begin == std::string::npos ? 0 : begin + 1));
  return module.rfind("ln", 0) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

GptEmbeddingImpl::GptEmbeddingImpl(int64_t vocab, int64_t hidden, int64_t seq_len,
                                   const torch::TensorOptions& t) {
  wte = register_parameter("wte", torch::empty({vocab, hidden}, t));
  wpe = register_parameter("wpe", torch::empty({seq_len, hidden}, t));
}

torch::Tensor GptEmbeddingImpl::forward(const torch::Tensor& tokens,
                                        const torch::Tensor& positions) {
  if (tokens.dim() != 2 || tokens.size(1) > wpe.size(0))
    throw std::invalid_argument("gpt: expected tokens [B,T] with T <= " +
                                std::to_string(wpe.size(0)) + ", got " + c10::str(tokens.sizes()));
  if (positions.defined() && (positions.dim() != 1 || positions.size(0) != tokens.size(1)))
    throw std::invalid_argument("gpt: expected positions [" + std::to_string(tokens.size(1)) +
                                "], got " + c10::str(positions.sizes()));
  const torch::Tensor given = resolve_positions(positions, tokens.size(1)); // or the scope's
  const torch::Tensor at = given.defined() ? given : sequence_positions(tokens.size(1), wpe);
  const torch::Tensor words =
      sum_ ? sum_(lookup_vocab_range(tokens, wte, first_)) : nn::functional::embedding(tokens, wte);
  return words + wpe.index_select(0, at);
}

void keep_vocabulary_rows(torch::Tensor& table, int64_t first, int64_t rows) {
  if (first < 0 || rows < 1 || first + rows > table.size(0))
    throw std::invalid_argument("vocabulary rows [" + std::to_string(first) + ", " +
                                std::to_string(first + rows) + ") are not in a table of " +
                                std::to_string(table.size(0)));
  torch::NoGradGuard no_grad;
  // set_data keeps the parameter (what the module and autograd hold); the rows are a copy
  // charged to the caller's GPU, and the whole table's memory goes.
  table.set_data(table.narrow(0, first, rows).clone(at::MemoryFormat::Contiguous));
}

void GptEmbeddingImpl::split_vocabulary(int64_t first, int64_t rows,
                                        std::function<torch::Tensor(const torch::Tensor&)> sum) {
  keep_vocabulary_rows(wte, first, rows);
  first_ = first;
  sum_ = std::move(sum);
}

GptBlockImpl::GptBlockImpl(const TransformerShape& o, int64_t layer, const torch::TensorOptions& t)
    : PreNormBlockImpl(
          BlockParts{"ln1", "ln2", nn::AnyModule(make_layer_norm(o.hidden, t)),
                     nn::AnyModule(make_layer_norm(o.hidden, t)),
                     Attention(AttentionOptions{o.hidden, o.heads, o.heads, true, "out", 0,
                                                o.dropout, layer},
                               t),
                     gpt_feed_forward(o, layer, t), o.dropout, layer}) {}

std::shared_ptr<FeedForward> gpt_feed_forward(const TransformerShape& o, int64_t,
                                              const torch::TensorOptions& t) {
  return GptMlp(o.hidden, gpt_ffn_hidden(o), t).ptr();
}

torch::Tensor TiedHeadImpl::forward(const torch::Tensor& x) {
  return nn::functional::linear(x, *wte_);
}

int64_t gpt_ffn_hidden(const TransformerShape& o) {
  return o.ffn_hidden > 0 ? o.ffn_hidden : 4 * o.hidden;
}

torch::nn::Sequential build_gpt(const TransformerShape& o, uint64_t seed,
                                const torch::TensorOptions& t) {
  if (o.layers < 1 || o.hidden < 1 || o.heads < 1 || o.seq_len < 1 || o.vocab < 1)
    throw std::invalid_argument("gpt: layers, hidden, heads, seq_len and vocab must be positive");
  if (o.ffn_hidden < 0)
    throw std::invalid_argument("gpt: ffn_hidden must be positive (or 0 for 4 x hidden)");
  if (o.hidden % o.heads != 0)
    throw std::invalid_argument("gpt: hidden " + std::to_string(o.hidden) +
                                " is not divisible by heads " + std::to_string(o.heads));
  nn::Sequential model;
  GptEmbedding embed(o.vocab, o.hidden, o.seq_len, t);
  model->push_back("embed", embed);
  for (int64_t l = 0; l < o.layers; ++l)
    model->push_back("block" + std::to_string(l), GptBlock(o, l, t));
  model->push_back("ln_f", make_layer_norm(o.hidden, t));
  if (o.tie_head)
    model->push_back("head", TiedHead(embed));
  else
    model->push_back("head", make_linear(o.hidden, o.vocab, false, t));
  if (t.device().is_meta())
    return model; // shapes only: nothing to initialize

  // Reseeding here makes the init independent of what the constructors drew.
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    torch::Tensor& p = item.value();
    const bool bias = ends_with(item.key(), ".bias");
    if (is_layer_norm_parameter(item.key()))
      bias ? p.zero_() : p.fill_(1.0);
    else if (bias)
      p.zero_();
    else
      p.normal_(0.0, kInitStd);
  }
  return model;
}

int64_t gpt_parameter_count(const TransformerShape& o) {
  const int64_t h = o.hidden, f = gpt_ffn_hidden(o);
  // attention 4H^2 + 4H, MLP 2HF + F + H, two LayerNorms 4H
  const int64_t block = 4 * h * h + 2 * h * f + f + 9 * h;
  return o.vocab * h + o.seq_len * h + o.layers * block + 2 * h + (o.tie_head ? 0 : o.vocab * h);
}

} // namespace meshsim
