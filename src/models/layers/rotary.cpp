// Rotary position embedding.
#include "models/layers/rotary.h"

#include <algorithm>
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

// YaRN's frequencies (Peng et al. 2023; Hugging Face's _compute_yarn_parameters): pair i turns
// original_max · theta^(-2i/d) / 2π times over the original context; the pairs that turn more
// than beta_fast times keep their frequency, those that turn fewer than beta_slow times are
// interpolated (divided by factor), and a linear ramp over the pairs between blends the two. The
// ramp's ends are whole pairs.
torch::Tensor yarn_frequencies(const torch::Tensor& inv_freq, double theta, int64_t d,
                               const RopeScaling& s) {
  const double context = static_cast<double>(s.original_max);
  const auto pair_turning = [&](double turns) { // the pair that turns `turns` times in context
    return d * std::log(context / (turns * 2 * M_PI)) / (2 * std::log(theta));
  };
  const double low = std::max(std::floor(pair_turning(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(pair_turning(s.beta_slow)), static_cast<double>(d - 1));
  if (low == high)
    high += 0.001; // as Hugging Face: no division by zero
  const torch::Tensor ramp =
      ((torch::arange(d / 2, inv_freq.options()) - low) / (high - low)).clamp(0, 1);
  const torch::Tensor kept = 1 - ramp; // 1: the pair keeps its frequency
  return inv_freq / s.factor * (1 - kept) + inv_freq * kept;
}

double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

} // namespace

double rope_attention_factor(const RopeScaling& s) {
  if (!s.yarn || !(s.factor > 0))
    return 1.0;
  if (s.mscale > 0 && s.mscale_all_dim > 0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

double rope_softmax_factor(const RopeScaling& s) {
  if (!s.yarn || !(s.factor > 0) || !(s.mscale_all_dim > 0))
    return 1.0;
  const double m = yarn_mscale(s.factor, s.mscale_all_dim);
  return m * m;
}

torch::Tensor apply_rotary(const torch::Tensor& input, const torch::Tensor& positions,
                           double theta, const RopeScaling& scaling, bool interleaved) {
  // Interleaved pairs (x0, x1), (x2, x3), ... are the halves' layout with its features
  // permuted: evens first, then odds. The result stays in the halves' layout, for q and k alike
  // (their product is the same).
  const torch::Tensor x =
      interleaved ? torch::cat({input.slice(-1, 0, input.size(-1), 2),
                                input.slice(-1, 1, input.size(-1), 2)},
                               -1)
                  : input;
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
    inv_freq = (scaling.yarn ? yarn_frequencies(base, theta, d, scaling)
                             : llama3_frequencies(base, scaling))
                   .to(compute.device());
  } else {
    inv_freq = 1.0 / torch::pow(theta, arange_allocated(0, d, 2, compute) / static_cast<double>(d));
  }
  const torch::Tensor angles = torch::outer(positions.to(compute), inv_freq); // [T, d/2]
  const torch::Tensor emb = torch::cat({angles, angles}, -1);                 // [T, d]
  torch::Tensor cos = emb.cos(), sin = emb.sin();
  if (const double factor = rope_attention_factor(scaling); factor != 1.0) {
    cos = cos * factor;
    sin = sin * factor;
  }
  return x * cos.to(x.scalar_type()) + rotate_half(x) * sin.to(x.scalar_type());
}

torch::Tensor arange_allocated(int64_t start, int64_t end, int64_t step,
                               const torch::TensorOptions& options) {
  torch::Tensor out = torch::empty({(end - start + step - 1) / step}, options);
  return torch::arange_out(out, start, end, step);
}

} // namespace meshsim
