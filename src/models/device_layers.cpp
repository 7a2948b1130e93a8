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

class DeviceConv2dImpl : public nn::Conv2dImpl {
public:
  // A 1-channel 1×1 kernel first: its reset() draws next to nothing.
  DeviceConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                   const torch::TensorOptions& t)
      : nn::Conv2dImpl(nn::Conv2dOptions(1, 1, 1).bias(false)) {
    options = nn::detail::ConvNdOptions<2>(in, out, kernel).stride(stride).padding(padding).bias(false);
    weight = parameters_["weight"] = torch::empty({out, in, kernel, kernel}, t).requires_grad_(true);
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

nn::Conv2d make_conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                       const torch::TensorOptions& tensors) {
  std::shared_ptr<nn::Conv2dImpl> impl =
      std::make_shared<DeviceConv2dImpl>(in, out, kernel, stride, padding, tensors);
  return nn::Conv2d(std::move(impl));
}

BatchNormImpl::BatchNormImpl(int64_t channels, const torch::TensorOptions& tensors) {
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", torch::empty({channels}, tensors));
  bias = register_parameter("bias", torch::empty({channels}, tensors));
  running_mean = register_buffer("running_mean", torch::empty({channels}, tensors));
  running_var = register_buffer("running_var", torch::empty({channels}, tensors));
  if (!tensors.device().is_meta()) {
    weight.fill_(1.0);
    bias.zero_();
    running_mean.zero_();
    running_var.fill_(1.0);
  }
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& x) {
  return torch::batch_norm(x, weight, bias, running_mean, running_var, is_training(),
                           /*momentum=*/0.1, /*eps=*/1e-5, /*cudnn_enabled=*/true);
}

} // namespace meshsim
