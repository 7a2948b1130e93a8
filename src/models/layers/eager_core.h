// The eager attention core: softmax(q kᵀ / √d + causal mask) v as separate kernels, keeping
// the [B, heads, T, T] scores and their softmax for backward (the memory a fused kernel
// would not hold); in training with dropout, also the probabilities' 1-byte mask and the
// dropped probabilities AV reads (Korthikanti et al.'s 5as²b: softmax 2, mask 1, output 2).
#pragma once

#include <torch/torch.h>

#include "models/layers/attention.h"

namespace meshsim {

/// softmax(q kᵀ / √d + causal mask) v on [B, heads, T, d] tensors (k and v with as many heads
/// as q); token i sees token j when positions[j] <= positions[i]. With `dropout` (p > 0), the
/// probabilities are dropped with attention_dropout_keep's mask (models/layers/dropout.h) at
/// the current draw's samples and these positions, and scaled by 1 / (1 - p).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& positions,
                               const AttentionDropout& dropout = {});

/// causal_attention as an AttentionCore.
class EagerCausalCore : public AttentionCore {
public:
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions) const override {
    return causal_attention(q, k, v, positions);
  }
  torch::Tensor forward_with_dropout(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& positions,
                                     const AttentionDropout& dropout) const override {
    return causal_attention(q, k, v, positions, dropout);
  }
};

} // namespace meshsim
