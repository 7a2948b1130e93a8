// GPT's MLP and Llama's SwiGLU.
#include "models/layers/mlp.h"

#include <stdexcept>

#include "models/device_layers.h"

namespace meshsim {

namespace nn = torch::nn;

namespace {

// The output features of a Linear slot as this rank holds it: its weight [F or F/tp, H].
double output_features(const nn::AnyModule& linear) {
  const torch::Tensor w = slot_weight(*linear.ptr());
  return w.defined() ? static_cast<double>(w.size(0)) : 0;
}

} // namespace

GptMlpImpl::GptMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& t) {
  fc_ = nn::AnyModule(register_module("fc", make_linear(hidden, ffn, true, t)));
  proj_ = nn::AnyModule(register_module("proj", make_linear(ffn, hidden, true, t)));
}

torch::Tensor GptMlpImpl::forward(const torch::Tensor& x) {
  return run_linear("proj", proj_, nn::functional::gelu(run_linear("fc", fc_, x)));
}

void GptMlpImpl::add_elementwise_work(LayerWork& total, double /*rows*/, double gathered,
                                      double /*width*/, double eb) const {
  add_elementwise(total, gathered * output_features(fc_), 8, 1, 1, eb); // exact GELU
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
  return run_linear("down", down_,
                    nn::functional::silu(run_linear("gate", gate_, x)) * run_linear("up", up_, x));
}

void SwiGluMlpImpl::add_elementwise_work(LayerWork& total, double /*rows*/, double gathered,
                                         double /*width*/, double eb) const {
  const double elements = gathered * output_features(gate_);
  add_elementwise(total, elements, 5, 1, 1, eb); // SiLU
  add_elementwise(total, elements, 1, 2, 1, eb); // · up(x)
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
