// FP8 training's extra memory, as Transformer Engine and torchao's float8 hold it, for a plan
// at --precision fp8.
//
// The model keeps its bf16 weights, bf16 gradients and fp32 optimizer state exactly as bf16
// mixed precision does (optim/optimizer.h). Beside them, each transformer-block weight that a
// GPU keeps has an FP8 copy, cast once per step and reused by every micro-batch, and the
// transpose of that copy (Hopper's FP8 GEMMs take one operand layout only, so the backward
// needs it written out): two bytes per element, charged to parameters. Each FP8 GEMM keeps
// the scales of its three operands (input, weight, output gradient), as current scaling does:
// an amax, a scale and its inverse in fp32, charged to other. The embedding, the head and
// the norms stay in bf16. What the plan does not charge: FP8 copies of saved activations
// (they are kept in bf16 here, an upper bound) and a ZeRO-3 gather's transient FP8 copy.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "parallel/data/zero.h"

namespace meshsim {

/// Bytes of one FP8 GEMM's scaling state: three operands × (amax, scale, scale⁻¹) × fp32.
constexpr int64_t kFp8ScalingBytesPerGemm = 3 * 3 * 4;

struct Fp8Footprint {
  int64_t weight_elements = 0; // of the block weights this GPU keeps (its ZeRO-3 shard)
  int64_t gemms = 0;           // FP8 GEMMs: one per block weight matrix, one per expert
};

/// What `stage`'s transformer blocks ("block<N>" children) run in FP8: every weight of two or
/// more dimensions (a Linear's [out, in], the experts' stacked [E, out, in], one GEMM per
/// expert). Under ZeRO 3 (`zero` ≥ 3) a GPU keeps 1/|group| of each, as its `groups` shard
/// them.
Fp8Footprint fp8_footprint(const torch::nn::Sequential& stage,
                           const std::vector<ParamGroup>& groups, int zero);

/// The FP8 copies and scaling state of `footprint`, allocated (charged) on `device` for the
/// current virtual GPU: held for as long as the returned tensors are.
std::vector<torch::Tensor> allocate_fp8_state(const Fp8Footprint& footprint, torch::Device device);

} // namespace meshsim
