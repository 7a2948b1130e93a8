// The GPT's modules, its build and init, and activation checkpointing (of a block, or of the
// attention core both transformers share).
#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "models/device_layers.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True):
// forward runs the function without recording a graph and keeps only its inputs; backward
// runs it again with grad enabled and backpropagates through that fresh graph, which
// accumulates into the .grad of the parameters it uses and yields the inputs' gradients.
// Collectives inside it (tensor-parallel layers of a block) run again in the recompute, in
// the same order on every member, because every member recomputes the same functions in the
// same order.
struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  // saved_data holds IValues: the function travels in a capsule that owns it.
  struct Held : torch::CustomClassHolder {
    explicit Held(Recomputable f) : fn(std::move(f)) {}
    Recomputable fn;
  };

  static torch::Tensor forward(AutogradContext* ctx, torch::TensorList inputs,
                               const Recomputable& fn) {
    // Function::apply has turned grad mode off here, so no activations are kept.
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<Held>(fn));
    return fn(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto held = c10::static_intrusive_pointer_cast<Held>(ctx->saved_data["fn"].toCapsule());
    std::vector<torch::Tensor> inputs;
    for (const torch::Tensor& saved : ctx->get_saved_variables())
      inputs.push_back(saved.detach().requires_grad_(saved.requires_grad()));
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true); // the engine runs backward with grad mode off
      out = held->fn(inputs);
    }
    torch::autograd::backward({out}, {grad_outputs[0]});
    variable_list grads;
    for (const torch::Tensor& input : inputs)
      grads.push_back(input.grad());
    grads.emplace_back(); // no gradient for the function
    return grads;
  }
};

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

torch::Tensor GptEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(1) > wpe.size(0))
    throw std::invalid_argument("gpt: expected tokens [B,T] with T <= " +
                                std::to_string(wpe.size(0)) + ", got " + c10::str(tokens.sizes()));
  return nn::functional::embedding(tokens, wte) + wpe.narrow(0, 0, tokens.size(1));
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t hidden, int64_t heads,
                                                 const torch::TensorOptions& t)
    : head_dim_(hidden / heads) {
  q_ = nn::AnyModule(register_module("q", make_linear(hidden, hidden, true, t)));
  k_ = nn::AnyModule(register_module("k", make_linear(hidden, hidden, true, t)));
  v_ = nn::AnyModule(register_module("v", make_linear(hidden, hidden, true, t)));
  out_ = nn::AnyModule(register_module("out", make_linear(hidden, hidden, true, t)));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  torch::Tensor q = q_.forward(x), k = k_.forward(x), v = v_.forward(x);
  // The whole sequence from q: under sequence parallelism x holds only part of it.
  const int64_t b = q.size(0), t = q.size(1), features = q.size(2);
  if (features % head_dim_ != 0)
    throw std::invalid_argument("attention: q has " + std::to_string(features) +
                                " features, not a whole number of heads of " +
                                std::to_string(head_dim_));
  const int64_t heads = features / head_dim_; // this member's heads when q is a shard
  auto split = [&](const torch::Tensor& y) {
    return y.view({b, t, heads, head_dim_}).transpose(1, 2); // [B, heads, T, head_dim]
  };
  q = split(q);
  k = split(k);
  v = split(v);
  torch::Tensor y = attention(q, k, v).transpose(1, 2).contiguous().view({b, t, features});
  return out_.forward(y);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
  const int64_t t = q.size(2), head_dim = q.size(3);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(head_dim)));
  const torch::Tensor future = torch::ones({t, t}, q.options().dtype(torch::kBool)).triu(1);
  att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  return torch::matmul(att, v);
}

nn::AnyModule& CausalSelfAttentionImpl::slot(const std::string& name) {
  if (name == "q")
    return q_;
  if (name == "k")
    return k_;
  if (name == "v")
    return v_;
  if (name == "out")
    return out_;
  throw std::invalid_argument("attention has no linear '" + name + "' (q, k, v, out)");
}

void CausalSelfAttentionImpl::replace_linear(const std::string& name, nn::AnyModule module) {
  nn::AnyModule& holder = slot(name);
  replace_module(name, module.ptr());
  holder = std::move(module);
}

GptMlpImpl::GptMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& t) {
  fc_ = nn::AnyModule(register_module("fc", make_linear(hidden, ffn, true, t)));
  proj_ = nn::AnyModule(register_module("proj", make_linear(ffn, hidden, true, t)));
}

torch::Tensor GptMlpImpl::forward(const torch::Tensor& x) {
  return proj_.forward(nn::functional::gelu(fc_.forward(x)));
}

void GptMlpImpl::replace_linear(const std::string& name, nn::AnyModule module) {
  if (name != "fc" && name != "proj")
    throw std::invalid_argument("mlp has no linear '" + name + "' (fc, proj)");
  replace_module(name, module.ptr());
  (name == "fc" ? fc_ : proj_) = std::move(module);
}

GptBlockImpl::GptBlockImpl(int64_t hidden, int64_t heads, int64_t ffn,
                           const torch::TensorOptions& t) {
  ln1_ = register_module("ln1", make_layer_norm(hidden, t));
  attn_ = register_module("attn", CausalSelfAttention(hidden, heads, t));
  ln2_ = register_module("ln2", make_layer_norm(hidden, t));
  mlp_ = register_module("mlp", GptMlp(hidden, ffn, t));
}

torch::Tensor GptBlockImpl::forward_plain(const torch::Tensor& x) {
  torch::Tensor h = x + attn_->forward(ln1_->forward(x));
  return h + mlp_->forward(ln2_->forward(h));
}

torch::Tensor checkpoint(const Recomputable& fn, const std::vector<torch::Tensor>& inputs) {
  // Checkpointing only pays when a graph is being recorded. Inputs that need no gradient
  // would leave the checkpoint node without edges, so the parameters would get none: run
  // such a function plainly (torch.utils.checkpoint warns in that case instead).
  const bool any_grad = std::any_of(inputs.begin(), inputs.end(),
                                    [](const torch::Tensor& t) { return t.requires_grad(); });
  if (torch::GradMode::is_enabled() && any_grad)
    return Checkpoint::apply(torch::TensorList(inputs), fn);
  return fn(inputs);
}

torch::Tensor CheckpointedBlock::checkpointed(const torch::Tensor& x) {
  if (!recompute)
    return forward_plain(x);
  // The block outlives the graph (the model owns it).
  return checkpoint([this](const std::vector<torch::Tensor>& in) { return forward_plain(in[0]); },
                    {x});
}

torch::Tensor CheckpointedAttention::attention(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v) const {
  if (!recompute_core)
    return causal_attention(q, k, v);
  return checkpoint(
      [](const std::vector<torch::Tensor>& in) { return causal_attention(in[0], in[1], in[2]); },
      {q, k, v});
}

torch::Tensor TiedHeadImpl::forward(const torch::Tensor& x) {
  return nn::functional::linear(x, embed_->wte);
}

int64_t gpt_ffn_hidden(const TransformerShape& o) {
  return o.ffn_hidden > 0 ? o.ffn_hidden : 4 * o.hidden;
}

torch::nn::Sequential build_gpt(const TransformerShape& o, uint64_t seed, const torch::TensorOptions& t) {
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
    model->push_back("block" + std::to_string(l),
                     GptBlock(o.hidden, o.heads, gpt_ffn_hidden(o), t));
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

void set_recompute(torch::nn::Sequential& model, Recompute recompute) {
  for (const auto& module : model->modules(/*include_self=*/false)) {
    if (auto* block = dynamic_cast<CheckpointedBlock*>(module.get()))
      block->recompute = recompute == Recompute::Full;
    if (auto* attention = dynamic_cast<CheckpointedAttention*>(module.get()))
      attention->recompute_core = recompute == Recompute::Selective;
  }
}

} // namespace meshsim
