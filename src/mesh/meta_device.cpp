// Meta kernels for the ops the 1.13 C++ library runs only on real devices (checked from C++:
// native_layer_norm, its backward, index_select and embedding_dense_backward for the
// transformers; convolution_overrideable, its backward, native_batch_norm, its backward and
// relu for ResNet-50. Python 1.13 has some of them, in Python). Each mirrors the outputs of the CPU kernel,
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

// An uninitialized tensor of `like`'s shape and options.
Tensor empty_as(const Tensor& like) { return at::empty(like.sizes(), like.options()); }

// The same when `wanted` and `like` exists (a gradient a backward kernel was asked for), else
// an undefined tensor.
Tensor empty_if(bool wanted, const Tensor& like) {
  return wanted && like.defined() ? empty_as(like) : Tensor();
}

Tensor empty_if(bool wanted, const c10::optional<Tensor>& like) {
  return like ? empty_if(wanted, *like) : Tensor();
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
  return {empty_as(input), at::empty(stat, input.options()), at::empty(stat, input.options())};
}

std::tuple<Tensor, Tensor, Tensor>
layer_norm_backward_meta(const Tensor&, const Tensor& input, c10::SymIntArrayRef, const Tensor&,
                         const Tensor&, const c10::optional<Tensor>& weight,
                         const c10::optional<Tensor>& bias, std::array<bool, 3> mask) {
  return {empty_if(mask[0], input), empty_if(mask[1], weight), empty_if(mask[2], bias)};
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

// 2.x declares the convolution ops' sizes as SymInt; 1.13 as int.
#if TORCH_VERSION_MAJOR >= 2
using Sizes = c10::SymIntArrayRef;
using Size = c10::SymInt;
int64_t to_int(const c10::SymInt& s) { return s.expect_int(); }
#else
using Sizes = at::IntArrayRef;
using Size = int64_t;
std::vector<int64_t> to_ints(at::IntArrayRef sizes) { return sizes.vec(); }
int64_t to_int(int64_t s) { return s; }
#endif

// [N, Cout, Hout, Wout] (any number of spatial dims) of a convolution, or of a transposed
// one, as the CPU kernel allocates it.
Tensor convolution_meta(const Tensor& input, const Tensor& weight, const c10::optional<Tensor>&,
                        Sizes stride, Sizes padding, Sizes dilation, bool transposed,
                        Sizes output_padding, Size groups) {
  const auto s = to_ints(stride), p = to_ints(padding), d = to_ints(dilation),
             op = to_ints(output_padding);
  std::vector<int64_t> out{input.size(0),
                           transposed ? weight.size(1) * to_int(groups) : weight.size(0)};
  for (int64_t i = 2; i < input.dim(); ++i) {
    const auto k = static_cast<size_t>(i - 2);
    const int64_t kernel = d[k] * (weight.size(i) - 1) + 1;
    out.push_back(transposed ? (input.size(i) - 1) * s[k] - 2 * p[k] + kernel + op[k]
                             : (input.size(i) + 2 * p[k] - kernel) / s[k] + 1);
  }
  return at::empty(out, input.options());
}

std::tuple<Tensor, Tensor, Tensor>
convolution_backward_meta(const Tensor&, const Tensor& input, const Tensor& weight, Sizes, Sizes,
                          Sizes, bool, Sizes, Size, std::array<bool, 3> mask) {
  return {empty_if(mask[0], input), empty_if(mask[1], weight),
          mask[2] ? at::empty({weight.size(0)}, weight.options()) : Tensor()};
}

// The output, and the per-channel mean and inverse standard deviation that training keeps
// for backward (empty in eval), as batch_norm_cpu allocates them.
std::tuple<Tensor, Tensor, Tensor>
batch_norm_meta(const Tensor& input, const c10::optional<Tensor>& weight,
                const c10::optional<Tensor>&, const c10::optional<Tensor>&,
                const c10::optional<Tensor>&, bool training, double, double) {
  const auto stats = weight && weight->defined() ? weight->options() : input.options();
  const int64_t channels = training ? input.size(1) : 0;
  return {empty_as(input), at::empty({channels}, stats), at::empty({channels}, stats)};
}

std::tuple<Tensor, Tensor, Tensor>
batch_norm_backward_meta(const Tensor&, const Tensor& input, const c10::optional<Tensor>& weight,
                         const c10::optional<Tensor>&, const c10::optional<Tensor>&,
                         const c10::optional<Tensor>&, const c10::optional<Tensor>&, bool, double,
                         std::array<bool, 3> mask) {
  // The bias gradient is shaped as the weight (BatchNorm's bias is per channel too).
  return {empty_if(mask[0], input), empty_if(mask[1], weight), empty_if(mask[2], weight)};
}

Tensor relu_meta(const Tensor& self) { return empty_as(self); }

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
    if (missing("aten::native_batch_norm"))
      library->impl("native_batch_norm", TORCH_FN(batch_norm_meta));
    if (missing("aten::native_batch_norm_backward"))
      library->impl("native_batch_norm_backward", TORCH_FN(batch_norm_backward_meta));
    if (missing("aten::relu"))
      library->impl("relu", TORCH_FN(relu_meta));
    // The convolutions' schemas are the ones whose sizes became SymInt; a version whose
    // schema differs again refuses the kernel here, and only convolutions stay off meta.
    try {
      if (missing("aten::convolution_overrideable"))
        library->impl("convolution_overrideable", TORCH_FN(convolution_meta));
      if (missing("aten::convolution_backward_overrideable"))
        library->impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_meta));
    } catch (const c10::Error&) {
    }
  });
}

} // namespace meshsim
