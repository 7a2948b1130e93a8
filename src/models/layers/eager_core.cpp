// The eager causal attention core.
#include "models/layers/eager_core.h"

#include <cmath>
#include <limits>
#include <stdexcept>

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
  if (dropout.p > 0) {
    const std::shared_ptr<const DropoutDraw> draw = current_dropout_draw();
    if (!draw || !draw->samples.defined() || draw->samples.size(0) != q.size(0))
      throw std::logic_error("attention dropout: no draw with the batch's " +
                             std::to_string(q.size(0)) + " sample indices is installed");
    att = apply_dropout_mask(att,
                             attention_dropout_keep(*draw, dropout.p, dropout.layer, draw->samples,
                                                    dropout.first_head, q.size(1), positions,
                                                    positions),
                             dropout.p);
  }
  return torch::matmul(att, v);
}

} // namespace meshsim
