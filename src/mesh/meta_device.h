// The meta device as a physical device for plans: tensors with shapes and dtypes but no
// storage, so real-size models can run through the strategies without their memory.
#pragma once

namespace meshsim {

/// Registers meta-device kernels for the ops LibTorch 1.13's C++ library leaves without one
/// and that meshsim's transformers need (layer_norm, embedding; forward and backward). Each
/// only computes its outputs' shapes and dtypes, and allocates the tensors the CPU kernel
/// returns, so a plan is charged what a CPU run holds. Idempotent.
void register_meta_kernels();

} // namespace meshsim
