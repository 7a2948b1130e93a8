// The eager attention core: softmax(q kᵀ / √d + causal mask) v as separate kernels, keeping
// the [B, heads, T, T] scores and their softmax for backward (the memory a fused kernel
// would not hold).
#pragma once

#include <torch/torch.h>

#include "models/layers/attention.h"

namespace meshsim {

/// softmax(q kᵀ / √d + causal mask) v on [B, heads, T, d] tensors (k and v with as many heads
/// as q); token i sees token j when positions[j] <= positions[i].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& positions);

/// causal_attention as an AttentionCore.
class EagerCausalCore : public AttentionCore {
public:
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions) const override {
    return causal_attention(q, k, v, positions);
  }
};

} // namespace meshsim
