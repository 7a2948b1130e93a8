// Exact model-state memory: for the CNN (421,642 parameters) with Adam under ddp, every
// GPU's peak parameters, gradients and optimizer bytes are 4, 4 and 8 bytes per parameter;
// peak activations roughly double from batch 32 to batch 64.
#include <gtest/gtest.h>

#include "models/models.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

int64_t peak(const VirtualGpu& gpu, MemoryCategory c) {
  return gpu.stats().peak_by_category[static_cast<size_t>(c)];
}

std::vector<int64_t> exact_peak_activations(int64_t per_gpu_batch) {
  const auto data = synthetic_dataset(1024, 16, 1).train;
  MeshOptions o;
  o.world_size = 4;
  o.capacity_bytes = int64_t{2} << 30;
  DeviceMesh mesh(o);
  StrategyOptions adam;  // defaults: cnn, adam lr 1e-3
  run_strategy(mesh, "ddp", adam, data, per_gpu_batch * 4, 3);
  std::vector<int64_t> out;
  const int64_t psi = 421642;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(peak(mesh.gpu(r), MemoryCategory::Parameters), 4 * psi) << "gpu" << r;
    EXPECT_EQ(peak(mesh.gpu(r), MemoryCategory::Gradients), 4 * psi) << "gpu" << r;
    EXPECT_EQ(peak(mesh.gpu(r), MemoryCategory::Optimizer), 8 * psi) << "gpu" << r;
    out.push_back(peak(mesh.gpu(r), MemoryCategory::Activations));
  }
  return out;
}

} // namespace

TEST(ParallelMemory, CnnHas421642Parameters) {
  EXPECT_EQ(count_parameters(*build_model("cnn", {})), 421642);
}

TEST(ParallelMemory, DdpAdamModelStateIsExactAndActivationsScaleWithBatch) {
  const auto at32 = exact_peak_activations(32);
  const auto at64 = exact_peak_activations(64);
  for (int r = 0; r < 4; ++r) {
    const double ratio = static_cast<double>(at64[r]) / static_cast<double>(at32[r]);
    EXPECT_GT(ratio, 1.7) << "gpu" << r;
    EXPECT_LT(ratio, 2.1) << "gpu" << r;
    RecordProperty("activation_ratio_gpu" + std::to_string(r), std::to_string(ratio));
  }
}
