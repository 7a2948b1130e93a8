// The eager causal attention core.
#include "models/layers/eager_core.h"

#include <cmath>
#include <limits>

#include "models/layers/dropout.h"

namespace meshsim {

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& positions,
                               const AttentionDropout& dropout) {
  const int64_t head_dim = q.size(3);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(head_dim)));
  // future[i][j]: token j comes after token i (triu(1) for positions 0..T-1).
  const torch::Tensor future = positions.unsqueeze(0) > positions.unsqueeze(1);
  att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  if (dropout.p > 0)
    att = apply_dropout_mask(att, dropout.keep(q.size(0), q.size(1), positions, positions),
                             dropout.p);
  return torch::matmul(att, v);
}

} // namespace meshsim
