// Roofline compute model: how long one kernel (or a phase of kernels) takes on a target GPU.
//
//   time = max(flops / (eff[op] * peak[dtype]), bytes / (eff.memory * mem_bw))
//
// The efficiency table is the one place where "vendor peak" becomes "what kernels achieve";
// it is a plain struct so a calibration run can overwrite it.
#pragma once

#include "cost/hardware.h"

namespace meshsim {

/// Kernel classes with distinct achievable efficiency.
enum class OpClass { Matmul, Attention, Normalization, Elementwise, Optimizer };

OpClass parse_op_class(const std::string& name); // "matmul", "conv", "attention", ...
const char* to_string(OpClass op);

/// Fraction of peak each op class achieves. Defaults (see docs/cost-model.md):
///  matmul/conv 0.70: large cuBLAS/cuDNN GEMMs reach 70-80% of dense tensor-core peak;
///  attention 0.50: FlashAttention-2 reports 50-73% forward on A100, less backward;
///  normalization/elementwise/optimizer 0.50: these are memory bound, so the value rarely
///    matters; they run on CUDA cores (fp32 peak), not tensor cores.
///  memory 1.0: bytes / mem_bw exactly; measured STREAM-like kernels reach ~0.85-0.92.
struct Efficiency {
  double matmul = 0.70;
  double attention = 0.50;
  double normalization = 0.50;
  double elementwise = 0.50;
  double optimizer = 0.50;
  double memory = 1.0;

  double of(OpClass op) const;
};

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
