// Each layer is constructed through its base Impl with the smallest options whose reset()
// and init succeed cheaply (zero-element CPU tensors), then replaces its registered
// parameters with full-size ones on the requested device. Writing parameters_[name] keeps
// the registration order (weight, bias) that named_parameters() and checkpoints rely on.
#include "models/device_layers.h"

namespace meshsim {

namespace nn = torch::nn;

class DeviceLinearImpl : public nn::LinearImpl {
public:
  // in_features 1, out_features 0: weight [0, 1], so kaiming_uniform_'s fan-in is 1 and its
  // bound finite (a fan-in of 0 would make the bound infinite and uniform_ refuse it).
  DeviceLinearImpl(int64_t in, int64_t out, bool with_bias, const torch::TensorOptions& t)
      : nn::LinearImpl(nn::LinearOptions(1, 0).bias(with_bias)) {
    options = nn::LinearOptions(in, out).bias(with_bias);
    weight = parameters_["weight"] = torch::empty({out, in}, t).requires_grad_(true);
    if (with_bias)
      bias = parameters_["bias"] = torch::empty({out}, t).requires_grad_(true);
  }
};

class DeviceLayerNormImpl : public nn::LayerNormImpl {
public:
  DeviceLayerNormImpl(int64_t width, const torch::TensorOptions& t)
      : nn::LayerNormImpl(nn::LayerNormOptions(std::vector<int64_t>{0})) {
    options = nn::LayerNormOptions({width});
    torch::NoGradGuard no_grad; // fill before requires_grad, as reset_parameters() does
    weight = parameters_["weight"] = torch::empty({width}, t);
    bias = parameters_["bias"] = torch::empty({width}, t);
    if (!t.device().is_meta()) { // meta tensors have no values to set
      weight.fill_(1.0);
      bias.zero_();
    }
    weight.requires_grad_(true);
    bias.requires_grad_(true);
  }
};

nn::Linear make_linear(int64_t in, int64_t out, bool bias, const torch::TensorOptions& tensors) {
  // A shared_ptr of the base type, or ModuleHolder's forwarding constructor would take it
  // for LinearImpl's constructor arguments.
  std::shared_ptr<nn::LinearImpl> impl = std::make_shared<DeviceLinearImpl>(in, out, bias, tensors);
  return nn::Linear(std::move(impl));
}

nn::LayerNorm make_layer_norm(int64_t width, const torch::TensorOptions& tensors) {
  std::shared_ptr<nn::LayerNormImpl> impl = std::make_shared<DeviceLayerNormImpl>(width, tensors);
  return nn::LayerNorm(std::move(impl));
}

} // namespace meshsim
