// Memory accounting: every byte a rank's thread allocates is charged to its virtual GPU
// under the current category; exceeding capacity raises OutOfMemory with the full story.
#include <gtest/gtest.h>

#include "memory/allocator.h"
#include "memory/virtual_gpu.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

using namespace meshsim;

TEST(MemoryAccounting, ChargesCurrentGpuAndCategory) {
  install_accounting_allocator();
  VirtualGpu gpu(0, 1 << 30);
  {
    GpuGuard guard(&gpu);
    CategoryScope scope(MemoryCategory::Parameters);
    auto a = torch::empty({1000}, torch::kFloat32);
    EXPECT_EQ(gpu.stats().current_by_category[0], 4000);
    {
      CategoryScope act(MemoryCategory::Activations);
      auto b = torch::empty({250}, torch::kFloat64);
      EXPECT_EQ(gpu.current_bytes(), 6000);
    }
    EXPECT_EQ(gpu.current_bytes(), 4000);
  }
  const auto s = gpu.stats();
  EXPECT_EQ(s.current, 0);
  EXPECT_EQ(s.peak, 6000);
  EXPECT_EQ(s.peak_by_category[static_cast<int>(MemoryCategory::Parameters)], 4000);
  EXPECT_EQ(s.peak_by_category[static_cast<int>(MemoryCategory::Activations)], 2000);
}

TEST(MemoryAccounting, FreeOnAnotherThreadReturnsToOwner) {
  install_accounting_allocator();
  VirtualGpu gpu(1, 1 << 30);
  torch::Tensor t;
  {
    GpuGuard guard(&gpu);
    t = torch::empty({256});
  }
  EXPECT_EQ(gpu.current_bytes(), 1024);
  std::thread([&] { t = torch::Tensor(); }).join();
  EXPECT_EQ(gpu.current_bytes(), 0);
}

TEST(MemoryAccounting, RanksAreChargedSeparately) {
  MeshOptions o;
  o.world_size = 3;
  o.capacity_bytes = 1 << 30;
  DeviceMesh mesh(o);
  run_ranks(mesh, [&](RankContext& ctx) {
    CategoryScope scope(MemoryCategory::Optimizer);
    auto t = torch::empty({(ctx.rank + 1) * 1000});
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(mesh.gpu(r).stats().peak_by_category[static_cast<int>(MemoryCategory::Optimizer)],
              (r + 1) * 4000);
}

TEST(MemoryAccounting, OutOfMemoryNamesGpuRequestCategoriesAndCapacity) {
  install_accounting_allocator();
  VirtualGpu gpu(3, 1024 * 1024);
  GpuGuard guard(&gpu);
  CategoryScope scope(MemoryCategory::Activations);
  auto kept = torch::empty({1024});  // 4 KiB in use
  try {
    auto big = torch::empty({1024 * 1024});
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gpu3"), std::string::npos) << what;
    EXPECT_NE(what.find("4.0 MiB"), std::string::npos) << what;       // the request
    EXPECT_NE(what.find("activations 4.0 KiB"), std::string::npos) << what;
    EXPECT_NE(what.find("capacity 1.0 MiB"), std::string::npos) << what;
  }
  EXPECT_EQ(gpu.current_bytes(), 4096);  // nothing charged for the failed request
}

TEST(MemoryAccounting, OomInsideBackwardIsReportedAsOom) {
  MeshOptions o;
  o.world_size = 2;
  o.capacity_bytes = 64 * 1024;
  DeviceMesh mesh(o);
  EXPECT_THROW(run_ranks(mesh,
                         [&](RankContext& ctx) {
                           auto w = torch::randn({64, 64}, torch::requires_grad());
                           auto y = (w.matmul(w) * w).sum();
                           y.backward();
                         }),
               OutOfMemory);
}

TEST(MemoryBytes, Format) {
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
}
