// Rotary position embedding.
#include "models/layers/rotary.h"

#include <cmath>

#include "models/layers/norms.h"

namespace meshsim {
namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Llama 3.1's frequencies (Hugging Face's _compute_llama3_parameters): a wavelength longer
// than the original context / low_freq_factor is stretched by `factor`, one shorter than the
// original context / high_freq_factor kept, and those between blend the two linearly in
// original context / wavelength.
torch::Tensor llama3_frequencies(const torch::Tensor& inv_freq, const RopeScaling& s) {
  const double context = static_cast<double>(s.original_max);
  const double low_wavelength = context / s.low_freq_factor;
  const double high_wavelength = context / s.high_freq_factor;
  const torch::Tensor wavelength = 2 * M_PI / inv_freq;
  const torch::Tensor stretched =
      torch::where(wavelength > low_wavelength, inv_freq / s.factor, inv_freq);
  const torch::Tensor smooth =
      (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor blended = (1 - smooth) * stretched / s.factor + smooth * stretched;
  const torch::Tensor medium =
      wavelength.ge(high_wavelength).logical_and(wavelength.le(low_wavelength));
  return torch::where(medium, blended, stretched);
}

} // namespace

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta,
                           const RopeScaling& scaling) {
  const int64_t d = x.size(-1);
  // The angles in float32 at least (bf16 would round the positions themselves), then in x's
  // dtype, as Hugging Face's Llama casts cos and sin.
  const auto compute =
      x.options().dtype(computes_in_float32(x.scalar_type()) ? torch::kFloat32 : x.scalar_type());
  torch::Tensor inv_freq;
  if (scaling.factor > 0) {
    // The d/2 frequencies on the host, then moved: a meta tensor has no values to scale by, and
    // LibTorch 1.13 has no meta kernel for where.
    const auto host = compute.device(torch::kCPU);
    const torch::Tensor base =
        1.0 / torch::pow(theta, torch::arange(0, d, 2, host) / static_cast<double>(d));
    inv_freq = llama3_frequencies(base, scaling).to(compute.device());
  } else {
    inv_freq = 1.0 / torch::pow(theta, arange_allocated(0, d, 2, compute) / static_cast<double>(d));
  }
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
