// Roofline compute model: how long one kernel (or a phase of kernels) takes on a target GPU.
//
//   time = max(flops / (eff[op] * peak[dtype]), bytes / (eff.memory * mem_bw))
//
// The efficiency table is the one place where "vendor peak" becomes "what kernels achieve";
// it is a plain struct so a calibration run can overwrite it.
#pragma once

#include <cstdint>

#include "cost/hardware.h"

namespace meshsim {

/// Kernel classes with distinct achievable efficiency.
enum class OpClass { Matmul, Attention, Normalization, Elementwise, Optimizer };

OpClass parse_op_class(const std::string& name); // "matmul", "conv", "attention", ...
const char* to_string(OpClass op);

/// Fraction of peak each op class achieves, and the costs around kernels. Defaults and
/// where each comes from: docs/cost-model.md.
///  matmul 0.67: what a large GEMM achieves of the dense tensor-core peak (every GPU but
///    Hopper), fitted on the three calibration rows of Narayanan et al. Table 1 in `meshsim
///    validate` (docs/cost-model.md).
///  gemm_half_s 10 us: the time at peak of a GEMM that reaches half of that: one wave of
///    128x256 output tiles with k = 512 on each of an A100's 108 SMs (3.6 GFLOP, 11.6 us at
///    312 TFLOP/s). Derived, not fitted: Table 1's GEMMs are all far larger.
///  attention 0.50: the attention core in records that carry no GEMM split (older records).
///  normalization/elementwise/optimizer 0.50: memory bound, so the value rarely matters; they
///    run on CUDA cores (fp32 peak), not tensor cores.
///  memory 0.88: STREAM-like kernels reach 0.85-0.92 of the datasheet bandwidth.
///  launch_s 5 us: one kernel's launch and the framework's dispatch, the floor of any kernel.
///  overlap_slowdown 0.1: compute runs this much slower while a collective runs beside it
///    (NCCL's kernels take 8-16 of the GPU's 108-132 SMs and a share of its memory bandwidth).
///  hopper_matmul 0.61: `matmul` on Hopper GPUs (h100, h100-96, h200, h800), fitted on the one
///    row declared for it before any H100 row was predicted: the Megatron-LM README's GPT 16B
///    on 192 H100. A Hopper GEMM reaches less of its datasheet peak than an Ampere one: the
///    peak is at the boost clock, which a 700 W H100 does not hold under GEMM load.
///  fp8_matmul 0.75: the same for FP8 GEMMs (Transformer Engine's, torchao's float8) of the FP8
///    peak, fitted on one row: Megatron-Bridge's Llama 3 70B FP8 on 64 H100 (container 26.04.01).
///    Each GEMM efficiency is fitted on one GPU generation's rows (matmul on A100, hopper_matmul
///    and fp8_matmul on H100); matmul serves every GPU but Hopper, fp8_matmul every GPU with
///    FP8 tensor cores (docs/cost-model.md).
struct Efficiency {
  double matmul = 0.67;
  double hopper_matmul = 0.61;
  double fp8_matmul = 0.75;
  double gemm_half_s = 10e-6;
  double attention = 0.50;
  double normalization = 0.50;
  double elementwise = 0.50;
  double optimizer = 0.50;
  double memory = 0.88;
  double launch_s = 5e-6;
  double overlap_slowdown = 0.1;

  double of(OpClass op) const;
  /// The large-GEMM efficiency of `dtype`'s GEMMs: fp8_matmul for FP8, else matmul.
  double matmul_for(Dtype dtype) const { return dtype == Dtype::FP8 ? fp8_matmul : matmul; }
  /// These efficiencies on `gpu`: matmul is hopper_matmul on a Hopper GPU.
  Efficiency on(const GpuSpec& gpu) const;
};

/// What a GEMM of `flops` achieves of the peak `peak_flops`: matmul x t / (t + gemm_half_s),
/// with t = flops / peak_flops, its time at peak.
double gemm_efficiency(double flops, double peak_flops, const Efficiency& eff);

/// A pass of one layer: `gemms` GEMM kernels with their FLOPs and bytes, and the other kernels'
/// (`kernels` in all, the GEMMs included) of class `other`.
struct KernelMix {
  double gemm_flops = 0;
  double gemm_bytes = 0;
  int64_t gemms = 0;
  double other_flops = 0;
  double other_bytes = 0;
  OpClass other = OpClass::Elementwise;
  int64_t kernels = 0;
  Dtype dtype = Dtype::BF16;
};

/// The GEMMs' roofline at their average size's efficiency, plus the other kernels' roofline,
/// and never less than `kernels` launches.
double kernel_mix_time(const KernelMix& mix, const GpuSpec& gpu, const Efficiency& eff = {});

/// What one kernel does: its math and its device-memory traffic.
struct ComputeWork {
  double flops = 0;
  double bytes = 0; // bytes read + written in device memory
  OpClass op = OpClass::Matmul;
  Dtype dtype = Dtype::BF16;
};

enum class Bound { Compute, Memory };
const char* to_string(Bound bound);

struct ComputeCost {
  double time_s = 0;
  Bound bound = Bound::Compute;
  double compute_s = 0; // flops / (eff * peak)
  double memory_s = 0;  // bytes / (eff.memory * mem_bw)
};

/// Peak FLOP/s the op class can use: tensor-core peak of `dtype` for matmul and attention,
/// the CUDA-core fp32 peak for everything else.
double op_peak_flops(const GpuSpec& gpu, OpClass op, Dtype dtype);

ComputeCost roofline(const ComputeWork& work, const GpuSpec& gpu, const Efficiency& eff = {});

/// Arithmetic intensity (FLOP/byte) above which `op` is compute bound on `gpu`.
double ridge_point(const GpuSpec& gpu, OpClass op, Dtype dtype, const Efficiency& eff = {});

/// C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs, reads A and B and writes C once.
ComputeWork matmul_work(double m, double n, double k, Dtype dtype);
/// An elementwise kernel over `elements`, reading `inputs` and writing `outputs` tensors of
/// that size, doing `flops_per_element` FLOPs each.
ComputeWork elementwise_work(double elements, int inputs, int outputs, double flops_per_element,
                             Dtype dtype);

} // namespace meshsim
