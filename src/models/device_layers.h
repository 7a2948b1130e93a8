// Linear, LayerNorm and Conv2d whose parameters are created directly on a device, in a dtype,
// and BatchNorm over image channels.
//
// LibTorch 1.13 cannot move a module to the meta device (Module::to(kMeta) fails in
// set_data), and nn::Linear / nn::LayerNorm allocate full CPU tensors in their constructors,
// so a 175B model cannot be built on the host and moved. These are still nn::Linear and
// nn::LayerNorm (subclasses of their Impls, handed out through the usual holders), so
// tensor parallelism, the FLOP counter and everything else that looks for those types by
// dynamic_cast or type name sees them unchanged.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace meshsim {

/// nn::Linear(in, out) with weight [out, in] (and bias [out]) created uninitialized with
/// `tensors` (its device and dtype). The caller initializes them.
torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias,
                              const torch::TensorOptions& tensors);

/// nn::LayerNorm over the last dimension `width`, weight 1 and bias 0 (on meta: shapes only),
/// created with `tensors`.
torch::nn::LayerNorm make_layer_norm(int64_t width, const torch::TensorOptions& tensors);

/// nn::Conv2d(in, out, kernel) without bias, weight [out, in, kernel, kernel] created
/// uninitialized with `tensors`. The caller initializes it.
torch::nn::Conv2d make_conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                              int64_t padding, const torch::TensorOptions& tensors);

/// BatchNorm over the channels of [N, C, H, W], as nn::BatchNorm2d computes it (momentum 0.1,
/// eps 1e-5, running mean and variance kept in training and used in eval), with its weight,
/// bias and running statistics created with `tensors`: weight 1, bias 0, mean 0, variance 1
/// (on meta: shapes only). LibTorch 1.13 cannot put nn::BatchNorm2d's buffers on another
/// device after construction, hence this module; its type name says "Norm" to the FLOP counter.
class BatchNormImpl : public torch::nn::Module {
public:
  BatchNormImpl(int64_t channels, const torch::TensorOptions& tensors);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias, running_mean, running_var;
};
TORCH_MODULE(BatchNorm);

} // namespace meshsim
