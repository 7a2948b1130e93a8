// The strategies on virtual GPUs carved out of a CUDA card train as they do on the CPU:
// DDP, ZeRO 3, tensor parallel 2 and pipeline parallel 2 on 4 virtual GPUs, 20 SGD steps,
// same seed and batches, and the same bytes of model state on every GPU.
//
// Tolerances, derived as in strategy_harness.h: summation order (the card's kernels add in
// other orders than the CPU's) is amplified at most 4.8e5 times over 20 steps, so float64 runs
// agree within kFloat64Tolerance (1e-9), and float32 runs within 4.8e5 x 2^-24 = 2.9e-2.
// TF32 is off on the card (device/physical_device.cpp): with it, float32 would round to 10 bits.
#include <gtest/gtest.h>

#include <array>
#include <iostream>

#include "../mesh/cuda_skip.h"
#include "data/text.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kCudaSteps = 20;
constexpr int kWorld = 4;
constexpr double kFloat32Tolerance = 4.8e5 * 5.9604644775390625e-8; // 2^-24

StrategyOptions options(const std::string& model, torch::Dtype dtype, int tp, int pp, int zero) {
  StrategyOptions o = tiny_gpt_sgd(dtype);
  o.model = model;
  o.tp = tp;
  o.pp = pp;
  o.zero = zero;
  o.micro_batches = pp > 1 ? 2 : 1;
  o.schedule = "1f1b";
  return o;
}

// Parameters, gradients and optimizer state each GPU holds after the last step.
using ModelState = std::vector<std::array<int64_t, 3>>;

struct Pair {
  HarnessRun cpu, cuda;
  std::unique_ptr<DeviceMesh> cpu_mesh, cuda_mesh;
  ModelState cpu_state = ModelState(kWorld), cuda_state = ModelState(kWorld);
};

Pair run_both(const std::string& model, const StrategyOptions& base) {
  const Dataset data = model == "gpt"
                           ? synthetic_text(512, 16, 16, 64, 3).train
                           : with_dtype(synthetic_dataset(2048, 16, 11).train, base.dtype);
  const int64_t global = model == "gpt" ? 16 : 32;
  Pair p;
  for (const std::string device : {"cpu", "cuda"}) {
    MeshOptions m;
    m.world_size = kWorld;
    m.capacity_bytes = int64_t{1} << 30;
    m.device = device;
    auto mesh = std::make_unique<DeviceMesh>(m);
    StrategyOptions o = base;
    if (device == "cuda")
      o.device = torch::Device(torch::kCUDA, 0);
    torch::manual_seed(5); // the same permutation of the data
    ModelState& state = device == "cpu" ? p.cpu_state : p.cuda_state;
    const AfterStep keep_state = [&](RankContext& ctx, Strategy&, int step) {
      if (step != kCudaSteps)
        return;
      const MemoryStats s = ctx.gpu.stats();
      int i = 0;
      for (auto c : {MemoryCategory::Parameters, MemoryCategory::Gradients, MemoryCategory::Optimizer})
        state[ctx.rank][i++] = s.current_by_category[static_cast<size_t>(c)];
    };
    HarnessRun run = run_strategy(*mesh, "ddp", o, data, global, kCudaSteps, keep_state);
    (device == "cpu" ? p.cpu : p.cuda) = std::move(run);
    (device == "cpu" ? p.cpu_mesh : p.cuda_mesh) = std::move(mesh);
  }
  return p;
}

void expect_same_training(const std::string& what, const std::string& model, torch::Dtype dtype,
                          int tp, int pp, int zero) {
  MESHSIM_REQUIRE_CUDA();
  const double tolerance = dtype == torch::kFloat64 ? kFloat64Tolerance : kFloat32Tolerance;
  const Pair p = run_both(model, options(model, dtype, tp, pp, zero));
  ASSERT_EQ(p.cuda.losses.size(), p.cpu.losses.size());
  double worst_loss = 0, worst_parameter = 0;
  for (int k = 0; k < kCudaSteps; ++k) {
    const double e = std::abs(p.cuda.losses[k] - p.cpu.losses[k]) / std::abs(p.cpu.losses[k]);
    EXPECT_LT(e, tolerance) << what << " step " << k + 1;
    worst_loss = std::max(worst_loss, e);
  }
  EXPECT_LT(p.cpu.losses.back(), p.cpu.losses.front()) << what << ": did not learn";
  ASSERT_EQ(p.cuda.parameters.size(), p.cpu.parameters.size());
  for (size_t i = 0; i < p.cpu.parameters.size(); ++i) {
    const double e = relative_error(p.cuda.parameters[i].cpu(), p.cpu.parameters[i], 1e-5);
    EXPECT_LT(e, tolerance) << what << " parameter " << i;
    worst_parameter = std::max(worst_parameter, e);
  }
  // Model state is the same bytes on the card as on the CPU, GPU by GPU: what each holds after
  // the last step. (Peaks can differ: some CPU kernels take scratch memory inside the
  // optimizer's step, float64 SGD's for one, that the card's kernels do not.)
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_GT(p.cpu_state[r][0], 0) << what << " gpu" << r << " holds no parameters";
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(p.cuda_state[r][i], p.cpu_state[r][i])
          << what << " gpu" << r << " " << (i == 0 ? "parameters" : i == 1 ? "gradients" : "optimizer");
  }
  std::cout << what << " (" << c10::toString(dtype) << "): CUDA vs CPU over " << kCudaSteps
            << " steps, worst loss difference " << worst_loss << ", worst parameter "
            << worst_parameter << " (tolerance " << tolerance << ")\n";
}

} // namespace

TEST(CudaEquivalence, DdpCnn) { expect_same_training("ddp cnn", "cnn", torch::kFloat32, 1, 1, 0); }
TEST(CudaEquivalence, DdpCnnFloat64) {
  expect_same_training("ddp cnn", "cnn", torch::kFloat64, 1, 1, 0);
}
TEST(CudaEquivalence, Zero3Gpt) { expect_same_training("zero 3", "gpt", torch::kFloat32, 1, 1, 3); }
TEST(CudaEquivalence, Zero3GptFloat64) {
  expect_same_training("zero 3", "gpt", torch::kFloat64, 1, 1, 3);
}
TEST(CudaEquivalence, TensorParallel2) {
  expect_same_training("tp 2", "gpt", torch::kFloat32, 2, 1, 0);
}
TEST(CudaEquivalence, TensorParallel2Float64) {
  expect_same_training("tp 2", "gpt", torch::kFloat64, 2, 1, 0);
}
TEST(CudaEquivalence, Pipeline2OneFOneB) {
  expect_same_training("pp 2 (1f1b)", "gpt", torch::kFloat32, 1, 2, 0);
}
TEST(CudaEquivalence, Pipeline2OneFOneBFloat64) {
  expect_same_training("pp 2 (1f1b)", "gpt", torch::kFloat64, 1, 2, 0);
}
