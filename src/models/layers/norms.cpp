// RMSNorm.
#include "models/layers/norms.h"

namespace meshsim {

bool computes_in_float32(torch::ScalarType t) {
  return t == torch::kBFloat16 || t == torch::kHalf;
}

RmsNormImpl::RmsNormImpl(int64_t width, double eps, const torch::TensorOptions& t) : eps_(eps) {
  torch::Tensor w = torch::empty({width}, t);
  if (!w.is_meta())
    w.fill_(1.0);
  weight = register_parameter("weight", w);
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = computes_in_float32(x.scalar_type()) ? x.to(torch::kFloat32) : x;
  const torch::Tensor normed = h * torch::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

void RmsNormImpl::add_elementwise_work(LayerWork& total, double rows, double /*gathered*/,
                                       double width, double eb) const {
  const double n = rows * width;
  const double weight_bytes = static_cast<double>(weight.numel() * weight.element_size());
  if (!eager_kernels()) {
    add_kernel(total, 5 * n, 2 * n * eb + weight_bytes);
    return;
  }
  // forward()'s ops on a 16-bit x (eb 2) compute in float32 (4 bytes), with a cast each way.
  const bool cast = eb < 4;
  const double c = cast ? 4 : eb;
  if (cast)
    add_kernel(total, 0, n * (eb + c));            // x.to(float32)
  add_kernel(total, n, 2 * n * c);                 // h.pow(2)
  add_kernel(total, n, (n + rows) * c);            // .mean(-1)
  add_kernel(total, rows, 2 * rows * c);           // + eps
  add_kernel(total, rows, 2 * rows * c);           // rsqrt
  add_kernel(total, n, (2 * n + rows) * c);        // h · rsqrt(...)
  if (cast)
    add_kernel(total, 0, n * (c + eb));            // .to(x's type)
  add_kernel(total, n, 2 * n * eb + weight_bytes); // weight · normed
}

} // namespace meshsim
