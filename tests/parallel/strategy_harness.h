// Drives strategies directly on hand-made global batches, so a multi-GPU run and the
// single-device reference see exactly the same samples at every step.
#pragma once

#include <functional>
#include <vector>

#include <torch/torch.h>

#include "data/dataset.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "parallel/strategy.h"

namespace meshsim::testing {

/// The tolerance of the float64 equivalence tests (losses and final parameters, relative).
/// Derived, not tuned: in float32 the worst difference seen between a strategy and
/// single-device training is 2.9e-2 relative (DDP on 3 GPUs, 20 SGD steps with momentum, on
/// an AVX2 CPU), from per-operation rounding of 6.0e-8 (float32's unit roundoff): summation
/// order amplified by at most 2.9e-2 / 6.0e-8 = 4.8e5 over the run. The same runs in float64
/// (unit roundoff 1.1e-16) then differ by at most 4.8e5 x 1.1e-16 = 5.3e-11. 1e-9 is that
/// with a margin of about 20 for other CPUs' kernels, and is still eight orders of magnitude
/// below what a real bug gives (a missing average or a skipped micro-batch moves the loss by
/// percent).
constexpr double kFloat64Tolerance = 1e-9;

/// A 4-layer GPT of width 32 trained by SGD with momentum in `dtype`, small enough for 20
/// steps on several virtual GPUs in a test, with several DDP buckets.
inline StrategyOptions tiny_gpt_sgd(torch::Dtype dtype = torch::kFloat64) {
  StrategyOptions o;
  o.model = "gpt";
  o.seed = 7;
  o.shape.layers = 4;
  o.shape.hidden = 32;
  o.shape.heads = 4;
  o.shape.seq_len = 16;
  o.shape.vocab = 64;
  o.optimizer.name = "sgd";
  o.optimizer.lr = 0.05;
  o.optimizer.momentum = 0.9;
  o.bucket_mb = 0.02; // several buckets
  o.dtype = dtype;
  return o;
}

/// `data` with its images in `dtype` (labels and token ids stay int64).
inline Dataset with_dtype(Dataset data, torch::Dtype dtype) {
  if (data.images.is_floating_point())
    data.images = data.images.to(dtype);
  return data;
}

struct HarnessRun {
  std::vector<double> losses;            // rank 0's reported loss per step
  std::vector<torch::Tensor> parameters; // rank 0's final parameters
  DeviceMesh* mesh = nullptr;
  std::vector<Recorder> recorders;       // every rank's compute regions and collectives
};

/// Global batch k is `global_batch` consecutive samples of a fixed permutation of `data`.
/// Strategies that shard give data shard i (see Strategy::data_shard) the i-th contiguous
/// slice of it.
/// `after_step` (optional) runs on every rank after each step, between steps.
using AfterStep = std::function<void(RankContext&, Strategy&, int step)>;

// A mesh of `world` virtual GPUs of `capacity_bytes` each.
inline MeshOptions mesh_options(int world, int64_t capacity_bytes = int64_t{2} << 30) {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = capacity_bytes;
  return o;
}

inline HarnessRun run_strategy(DeviceMesh& mesh, const std::string& strategy,
                               const StrategyOptions& options, const Dataset& data,
                               int64_t global_batch, int steps, const AfterStep& after_step = {}) {
  HarnessRun out;
  out.mesh = &mesh;
  torch::Tensor order = torch::randperm(data.size(), torch::TensorOptions().dtype(torch::kLong));
  out.recorders = run_ranks(mesh, [&](RankContext& ctx) {
    auto s = make_strategy(strategy, ctx, options);
    for (int k = 0; k < steps; ++k) {
      const int64_t begin = (k * global_batch) % (data.size() - global_batch);
      Batch b;
      std::vector<int64_t> idx;
      if (s->rank0_loads_global_batch()) {
        if (ctx.rank == 0)
          for (int64_t i = 0; i < global_batch; ++i)
            idx.push_back(order[begin + i].item<int64_t>());
      } else {
        const DataShard shard = s->data_shard(ctx);
        const int64_t local = global_batch / shard.replicas;
        for (int64_t i = 0; i < local; ++i)
          idx.push_back(order[begin + shard.index * local + i].item<int64_t>());
      }
      if (!idx.empty())
        std::tie(b.inputs, b.targets) = gather_batch(data, idx);
      if (ctx.mesh.on_card())
        b = b.to(torch::Device(torch::kCUDA, 0));
      const double loss = s->step(b, k + 1);
      if (ctx.rank == 0)
        out.losses.push_back(loss);
      if (after_step)
        after_step(ctx, *s, k + 1);
    }
    GpuGuard host(nullptr);
    auto parameters = s->full_parameters(); // collective
    if (ctx.rank == 0)
      out.parameters = std::move(parameters);
  });
  return out;
}

/// ||a - b|| / max(||b||, floor). The floor is for parameters that are zero in exact
/// arithmetic (a GPT's key bias gets no gradient: softmax ignores a shift shared by all
/// keys), where both runs hold rounding noise of ~1e-11 and a ratio would mean nothing.
inline double relative_error(const torch::Tensor& a, const torch::Tensor& b, double floor = 0) {
  const double denom = std::max(b.norm().item<double>(), floor);
  return (a - b).norm().item<double>() / (denom > 0 ? denom : 1.0);
}

} // namespace meshsim::testing
