// Roofline compute model: implementation. See roofline.h for the formula.
#include "cost/roofline.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace meshsim {

OpClass parse_op_class(const std::string& name) {
  std::string key = name;
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (key == "matmul" || key == "conv" || key == "gemm")
    return OpClass::Matmul;
  if (key == "attention")
    return OpClass::Attention;
  if (key == "normalization" || key == "norm")
    return OpClass::Normalization;
  if (key == "elementwise")
    return OpClass::Elementwise;
  if (key == "optimizer")
    return OpClass::Optimizer;
  throw std::invalid_argument("unknown op class \"" + name +
                              "\" (known: matmul, conv, attention, normalization, elementwise, "
                              "optimizer)");
}

const char* to_string(OpClass op) {
  switch (op) {
  case OpClass::Matmul:
    return "matmul";
  case OpClass::Attention:
    return "attention";
  case OpClass::Normalization:
    return "normalization";
  case OpClass::Elementwise:
    return "elementwise";
  case OpClass::Optimizer:
    return "optimizer";
  }
  return "?";
}

const char* to_string(Bound bound) {
  return bound == Bound::Compute ? "compute" : "memory";
}

double Efficiency::of(OpClass op) const {
  switch (op) {
  case OpClass::Matmul:
    return matmul;
  case OpClass::Attention:
    return attention;
  case OpClass::Normalization:
    return normalization;
  case OpClass::Elementwise:
    return elementwise;
  case OpClass::Optimizer:
    return optimizer;
  }
  return matmul;
}

Efficiency Efficiency::on(const GpuSpec& gpu) const {
  Efficiency out = *this;
  if (gpu.arch == GpuArch::Hopper)
    out.matmul = hopper_matmul;
  return out;
}

double op_peak_flops(const GpuSpec& gpu, OpClass op, Dtype dtype) {
  // Only GEMM-shaped work (matmul, conv, attention) runs on tensor cores.
  const bool tensor_core = op == OpClass::Matmul || op == OpClass::Attention;
  return tensor_core ? gpu.peak_flops(dtype) : gpu.fp32_flops;
}

ComputeCost roofline(const ComputeWork& work, const GpuSpec& gpu, const Efficiency& eff) {
  if (work.flops < 0 || work.bytes < 0)
    throw std::invalid_argument("roofline: negative flops or bytes");
  const double flop_rate = eff.of(work.op) * op_peak_flops(gpu, work.op, work.dtype);
  const double byte_rate = eff.memory * gpu.mem_bw;
  if (flop_rate <= 0 || byte_rate <= 0)
    throw std::invalid_argument("roofline: GPU \"" + gpu.name + "\" has a zero peak or efficiency" +
                                (work.dtype == Dtype::FP8 ? " (no FP8 tensor cores)" : ""));

  ComputeCost cost;
  cost.compute_s = work.flops / flop_rate;
  cost.memory_s = work.bytes / byte_rate;
  cost.bound = cost.compute_s >= cost.memory_s ? Bound::Compute : Bound::Memory;
  cost.time_s = std::max(cost.compute_s, cost.memory_s);
  return cost;
}

double ridge_point(const GpuSpec& gpu, OpClass op, Dtype dtype, const Efficiency& eff) {
  return eff.of(op) * op_peak_flops(gpu, op, dtype) / (eff.memory * gpu.mem_bw);
}

double gemm_efficiency(double flops, double peak_flops, const Efficiency& eff) {
  if (flops <= 0 || peak_flops <= 0)
    return eff.matmul;
  const double at_peak = flops / peak_flops;
  return eff.matmul * at_peak / (at_peak + eff.gemm_half_s);
}

double kernel_mix_time(const KernelMix& mix, const GpuSpec& gpu, const Efficiency& eff) {
  double time = 0;
  if (mix.gemms > 0 && (mix.gemm_flops > 0 || mix.gemm_bytes > 0)) {
    const double peak = op_peak_flops(gpu, OpClass::Matmul, mix.dtype);
    const double per_gemm = mix.gemm_flops / static_cast<double>(mix.gemms);
    Efficiency sized = eff;
    sized.matmul = eff.matmul_for(mix.dtype);
    sized.matmul = gemm_efficiency(per_gemm, peak, sized);
    time += roofline({mix.gemm_flops, mix.gemm_bytes, OpClass::Matmul, mix.dtype}, gpu, sized)
                .time_s;
  }
  if (mix.other_flops > 0 || mix.other_bytes > 0)
    time += roofline({mix.other_flops, mix.other_bytes, mix.other, mix.dtype}, gpu, eff).time_s;
  return std::max(time, static_cast<double>(mix.kernels) * eff.launch_s);
}

ComputeWork matmul_work(double m, double n, double k, Dtype dtype) {
  constexpr double kFlopsPerMac = 2; // one multiply + one add
  ComputeWork work;
  work.flops = kFlopsPerMac * m * n * k;
  work.bytes = (m * k + k * n + m * n) * dtype_bytes(dtype);
  work.op = OpClass::Matmul;
  work.dtype = dtype;
  return work;
}

ComputeWork elementwise_work(double elements, int inputs, int outputs, double flops_per_element,
                             Dtype dtype) {
  ComputeWork work;
  work.flops = elements * flops_per_element;
  work.bytes = elements * (inputs + outputs) * dtype_bytes(dtype);
  work.op = OpClass::Elementwise;
  work.dtype = dtype;
  return work;
}

} // namespace meshsim
