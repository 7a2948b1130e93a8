// Normalizations a transformer block is built from (LayerNorm is nn::LayerNorm, made by
// make_layer_norm in models/device_layers.h); RMSNorm here.
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "models/layers/flops.h"

namespace meshsim {

/// True for bf16 and fp16: the types normalization and rotary angles are computed above
/// (in float32), as Llama's reference does.
bool computes_in_float32(torch::ScalarType type);

/// RMSNorm: x / sqrt(mean(x^2) + eps) * weight over the last dimension, weight only. bf16
/// and fp16 inputs are normalized in float32 and cast back, as Llama's reference does.
class RmsNormImpl : public torch::nn::Module, public ElementwiseWork {
public:
  RmsNormImpl(int64_t width, double eps, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  /// Fused: one kernel, 5 FLOPs an element, x read and the output written (as any norm).
  /// Eager: forward's own ops, each a kernel (the casts only for a 16-bit x): x to float32,
  /// its square, their mean over the row, + eps, rsqrt, x · that, back to x's type, · weight.
  void add_elementwise_work(LayerWork& total, double rows, double gathered, double width,
                            double eb) const override;
  torch::Tensor weight;

private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

} // namespace meshsim
