// GPT's MLP and Llama's SwiGLU.
#include "models/layers/mlp.h"

#include <stdexcept>

#include "models/device_layers.h"

namespace meshsim {

namespace nn = torch::nn;

GptMlpImpl::GptMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& t) {
  fc_ = nn::AnyModule(register_module("fc", make_linear(hidden, ffn, true, t)));
  proj_ = nn::AnyModule(register_module("proj", make_linear(ffn, hidden, true, t)));
}

namespace {

// fn(x), checkpointed when `recompute` is on: backward runs it again from x (op-level
// recomputation of a feed-forward's first matmul and its activation).
template <typename Fn>
torch::Tensor maybe_checkpointed(bool recompute, const torch::Tensor& x, Fn fn) {
  if (!recompute)
    return fn(x);
  return checkpoint([fn](const std::vector<torch::Tensor>& in) { return fn(in[0]); }, {x});
}

} // namespace

torch::Tensor GptMlpImpl::forward(const torch::Tensor& x) {
  nn::AnyModule* fc = &fc_; // the module outlives the graph
  return proj_.forward(maybe_checkpointed(recompute_first, x, [fc](const torch::Tensor& in) {
    return nn::functional::gelu(fc->forward(in));
  }));
}

void GptMlpImpl::replace_linear(const std::string& name, nn::AnyModule module) {
  if (name != "fc" && name != "proj")
    throw std::invalid_argument("mlp has no linear '" + name + "' (fc, proj)");
  replace_module(name, module.ptr());
  (name == "fc" ? fc_ : proj_) = std::move(module);
}

SwiGluMlpImpl::SwiGluMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& t) {
  gate_ = nn::AnyModule(register_module("gate", make_linear(hidden, ffn, false, t)));
  up_ = nn::AnyModule(register_module("up", make_linear(hidden, ffn, false, t)));
  down_ = nn::AnyModule(register_module("down", make_linear(ffn, hidden, false, t)));
}

torch::Tensor SwiGluMlpImpl::forward(const torch::Tensor& x) {
  nn::AnyModule* gate = &gate_; // the module outlives the graph
  const torch::Tensor activated = maybe_checkpointed(
      recompute_first, x, [gate](const torch::Tensor& in) { return nn::functional::silu(gate->forward(in)); });
  return down_.forward(activated * up_.forward(x));
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

} // namespace meshsim
