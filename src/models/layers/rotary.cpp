// Rotary position embedding.
#include "models/layers/rotary.h"

#include "models/layers/norms.h"

namespace meshsim {
namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

} // namespace

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta) {
  const int64_t d = x.size(-1);
  // The angles in float32 at least (bf16 would round the positions themselves), then in x's
  // dtype, as Hugging Face's Llama casts cos and sin.
  const auto compute =
      x.options().dtype(computes_in_float32(x.scalar_type()) ? torch::kFloat32 : x.scalar_type());
  const torch::Tensor inv_freq =
      1.0 / torch::pow(theta, arange_allocated(0, d, 2, compute) / static_cast<double>(d));
  const torch::Tensor angles = torch::outer(positions.to(compute), inv_freq); // [T, d/2]
  const torch::Tensor emb = torch::cat({angles, angles}, -1);                 // [T, d]
  const torch::Tensor cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
  return x * cos + rotate_half(x) * sin;
}

torch::Tensor arange_allocated(int64_t start, int64_t end, int64_t step,
                               const torch::TensorOptions& options) {
  torch::Tensor out = torch::empty({(end - start + step - 1) / step}, options);
  return torch::arange_out(out, start, end, step);
}

} // namespace meshsim
