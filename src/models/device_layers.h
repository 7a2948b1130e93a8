// Linear and LayerNorm whose parameters are created directly on a device, in a dtype.
//
// LibTorch 1.13 cannot move a module to the meta device (Module::to(kMeta) fails in
// set_data), and nn::Linear / nn::LayerNorm allocate full CPU tensors in their constructors,
// so a 175B model cannot be built on the host and moved. These are still nn::Linear and
// nn::LayerNorm (subclasses of their Impls, handed out through the usual holders), so
// tensor parallelism, the FLOP counter and everything else that looks for those types by
// dynamic_cast or type name sees them unchanged.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace meshsim {

/// nn::Linear(in, out) with weight [out, in] (and bias [out]) created uninitialized with
/// `tensors` (its device and dtype). The caller initializes them.
torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias,
                              const torch::TensorOptions& tensors);

/// nn::LayerNorm over the last dimension `width`, weight 1 and bias 0 (on meta: shapes only),
/// created with `tensors`.
torch::nn::LayerNorm make_layer_norm(int64_t width, const torch::TensorOptions& tensors);

} // namespace meshsim
