// Normalizations a transformer block is built from (LayerNorm is nn::LayerNorm, made by
// make_layer_norm in models/device_layers.h); RMSNorm here.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace meshsim {

/// True for bf16 and fp16: the types normalization and rotary angles are computed above
/// (in float32), as Llama's reference does.
bool computes_in_float32(torch::ScalarType type);

/// RMSNorm: x / sqrt(mean(x^2) + eps) * weight over the last dimension, weight only. bf16
/// and fp16 inputs are normalized in float32 and cast back, as Llama's reference does.
class RmsNormImpl : public torch::nn::Module {
public:
  RmsNormImpl(int64_t width, double eps, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

} // namespace meshsim
