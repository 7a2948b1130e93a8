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

} // namespace meshsim
