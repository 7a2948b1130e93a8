// Meta kernels for the ops the 1.13 C++ library runs only on real devices (checked from C++:
// native_layer_norm, its backward, index_select and embedding_dense_backward have no meta
// kernel there; Python 1.13 has them, in Python). Each mirrors the outputs of the CPU kernel,
// which is what the accounting compares against. Later LibTorch versions have some of them
// (2.x) and changed some signatures (embedding_dense_backward's padding_idx became a SymInt);
// an op that already has a meta kernel keeps it.
#include "mesh/meta_device.h"

#include <mutex>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/version.h>

namespace meshsim {
namespace {

using at::Tensor;

std::vector<int64_t> to_ints(c10::SymIntArrayRef sizes) {
  std::vector<int64_t> out;
  for (const auto& s : sizes)
    out.push_back(s.expect_int());
  return out;
}

// Output [*input], mean and rstd [*leading dims, 1, ...] in the input's dtype, as
// layer_norm_cpu allocates them.
std::tuple<Tensor, Tensor, Tensor> layer_norm_meta(const Tensor& input,
                                                   c10::SymIntArrayRef normalized_shape,
                                                   const c10::optional<Tensor>&,
                                                   const c10::optional<Tensor>&, double) {
  const auto normalized = to_ints(normalized_shape);
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  TORCH_CHECK(axis >= 0, "layer_norm: input of ", input.dim(), " dims, normalized shape of ",
              normalized.size());
  std::vector<int64_t> stat(input.sizes().begin(), input.sizes().begin() + axis);
  stat.resize(static_cast<size_t>(input.dim()), 1);
  Tensor out = at::empty(input.sizes(), input.options());
  Tensor mean = at::empty(stat, input.options());
  Tensor rstd = at::empty(stat, input.options());
  return {out, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor>
layer_norm_backward_meta(const Tensor&, const Tensor& input, c10::SymIntArrayRef, const Tensor&,
                         const Tensor&, const c10::optional<Tensor>& weight,
                         const c10::optional<Tensor>& bias, std::array<bool, 3> mask) {
  Tensor grad_input, grad_weight, grad_bias;
  if (mask[0])
    grad_input = at::empty(input.sizes(), input.options());
  if (mask[1] && weight && weight->defined())
    grad_weight = at::empty(weight->sizes(), weight->options());
  if (mask[2] && bias && bias->defined())
    grad_bias = at::empty(bias->sizes(), bias->options());
  return {grad_input, grad_weight, grad_bias};
}

Tensor index_select_meta(const Tensor& self, int64_t dim, const Tensor& index) {
  TORCH_CHECK(index.dim() <= 1, "index_select: index must be 0- or 1-dimensional");
  const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  if (!sizes.empty())
    sizes[static_cast<size_t>(d)] = index.numel();
  return at::empty(sizes, self.options());
}

#if TORCH_VERSION_MAJOR >= 2
using PaddingIndex = c10::SymInt;
#else
using PaddingIndex = int64_t;
#endif

Tensor embedding_backward_meta(const Tensor& grad_output, const Tensor&, c10::SymInt num_weights,
                               PaddingIndex, bool) {
  return at::empty({num_weights.expect_int(), grad_output.size(-1)}, grad_output.options());
}

} // namespace

void register_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: the registrations must outlive every plan.
    auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                       __FILE__, __LINE__);
    const auto missing = [](const char* op) {
      const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
      return !handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::Meta);
    };
    if (missing("aten::native_layer_norm"))
      library->impl("native_layer_norm", TORCH_FN(layer_norm_meta));
    if (missing("aten::native_layer_norm_backward"))
      library->impl("native_layer_norm_backward", TORCH_FN(layer_norm_backward_meta));
    if (missing("aten::index_select"))
      library->impl("index_select", TORCH_FN(index_select_meta));
    if (missing("aten::embedding_dense_backward"))
      library->impl("embedding_dense_backward", TORCH_FN(embedding_backward_meta));
  });
}

} // namespace meshsim
