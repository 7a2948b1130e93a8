// The plain-ops partial attention (out and log-sum-exp).
#include "models/layers/partial_attention.h"

#include <cmath>
#include <limits>

namespace meshsim {

BlockAttention partial_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v,
                                           const torch::Tensor& q_positions,
                                           const torch::Tensor& k_positions, int64_t,
                                           const AttentionDropout& dropout) {
  const double inf = std::numeric_limits<double>::infinity();
  const torch::Tensor scores =
      torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  // future[i][j]: key j comes after query i, which does not see it.
  const torch::Tensor future = k_positions.unsqueeze(0) > q_positions.unsqueeze(1); // [Tq, Tk]
  const torch::Tensor masked = scores.masked_fill(future, -inf);
  // The row's maximum as a constant shift (log Σ exp(s) = m + log Σ exp(s - m) for any m,
  // so its gradient is not needed), 0 for a row that sees nothing, whose exp() are then 0.
  torch::Tensor shift = std::get<0>(masked.max(-1, /*keepdim=*/true)).detach();
  const torch::Tensor empty = shift.eq(-inf); // [B, h, Tq, 1]: the row sees no key
  shift = shift.masked_fill(empty, 0.0);
  const torch::Tensor weights = torch::exp(masked - shift);  // 0 where masked
  // Σ exp over a row that sees nothing is 0: divide by 1 there instead (its weights are 0),
  // so neither out nor the gradients see 0/0.
  const torch::Tensor sum = weights.sum(-1, /*keepdim=*/true);
  const torch::Tensor safe_sum = sum.masked_fill(empty, 1.0);
  BlockAttention r;
  torch::Tensor probabilities = weights / safe_sum;
  if (dropout.p > 0)
    probabilities = apply_dropout_mask(
        probabilities, dropout.keep(q.size(0), q.size(1), q_positions, k_positions), dropout.p);
  r.out = torch::matmul(probabilities, v);
  r.lse = (shift + torch::log(safe_sum)).masked_fill(empty, -inf).squeeze(-1);
  return r;
}

} // namespace meshsim
