// Virtual GPUs carved out of one CUDA card: each allocation charged to the virtual GPU whose
// rank made it (forward and backward), the sums equal to what the caching allocator reports
// for the card, and a capacity that applies to the segments a GPU takes.
#include <gtest/gtest.h>

#include <numeric>

#include <torch/torch.h>

#include "../mesh/cuda_skip.h"
#include "memory/allocator.h"
#include "memory/cuda_allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

using namespace meshsim;

namespace {

MeshOptions card(int world, int64_t capacity) {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = capacity;
  o.device = "cuda";
  return o;
}

int64_t category(const VirtualGpu& g, MemoryCategory c) {
  return g.stats().current_by_category[static_cast<size_t>(c)];
}

} // namespace

TEST(CudaMemory, EachRankIsChargedItsOwnForwardAndBackward) {
  MESHSIM_REQUIRE_CUDA();
  DeviceMesh mesh(card(2, int64_t{1} << 30));
  std::vector<torch::Tensor> kept(2);
  run_ranks(mesh, [&](RankContext& ctx) {
    const int64_t width = 128 * (ctx.rank + 1); // the ranks' sizes differ
    const auto on_card = torch::TensorOptions().device(torch::kCUDA, 0);
    torch::Tensor w;
    {
      CategoryScope scope(MemoryCategory::Parameters);
      w = torch::randn({width, width}, on_card).requires_grad_(true);
    }
    EXPECT_EQ(category(ctx.gpu, MemoryCategory::Parameters), width * width * 4);
    {
      CategoryScope scope(MemoryCategory::Activations);
      torch::Tensor x = torch::randn({64, width}, on_card);
      x.mm(w).relu().sum().backward(); // backward on this rank's thread and stream
    }
    // What is left: the weight and the gradient backward made for it, in the scope that
    // was current when backward ran (its own thread's).
    EXPECT_TRUE(w.grad().defined());
    EXPECT_EQ(category(ctx.gpu, MemoryCategory::Parameters), width * width * 4);
    EXPECT_GE(category(ctx.gpu, MemoryCategory::Activations), width * width * 4);
    kept[ctx.rank] = w;
  });
  EXPECT_NE(mesh.gpu(0).current_bytes(), mesh.gpu(1).current_bytes());
}

TEST(CudaMemory, SumsEqualTheCachingAllocatorsView) {
  MESHSIM_REQUIRE_CUDA();
  cuda_synchronize();
  const CudaPool::Use before = cuda_card_use();
  DeviceMesh mesh(card(4, int64_t{1} << 30));
  std::vector<std::vector<torch::Tensor>> kept(4);
  run_ranks(mesh, [&](RankContext& ctx) {
    CategoryScope scope(MemoryCategory::Activations);
    const auto on_card = torch::TensorOptions().device(torch::kCUDA, 0);
    // Sizes that the allocator rounds (to 512 B blocks) and large ones (own segments).
    for (int64_t n : {1, 100, 1000, 12345, 1 << 20, 3 << 20})
      kept[ctx.rank].push_back(torch::empty({n + ctx.rank}, on_card));
  });
  cuda_synchronize();
  const CudaPool::Use after = cuda_card_use();
  int64_t requested = 0, allocated = 0, reserved = 0;
  for (int r = 0; r < 4; ++r) {
    const CudaPool::Use u = mesh.pool(r)->use();
    EXPECT_EQ(u.reserved, mesh.gpu(r).reserved_bytes()) << "gpu" << r;
    EXPECT_EQ(u.requested, mesh.gpu(r).current_bytes()) << "gpu" << r;
    requested += mesh.gpu(r).current_bytes();
    allocated += u.allocated;
    reserved += u.reserved;
  }
  EXPECT_EQ(requested, after.requested - before.requested);
  EXPECT_EQ(allocated, after.allocated - before.allocated);
  EXPECT_EQ(reserved, after.reserved - before.reserved);
  EXPECT_GE(allocated, requested); // blocks: requests rounded up to 512 B
  std::cout << "4 virtual GPUs: requested " << requested << " B, allocated " << allocated
            << " B, reserved " << reserved << " B; the card's allocator: "
            << after.requested - before.requested << " / " << after.allocated - before.allocated
            << " / " << after.reserved - before.reserved << "\n";
}

TEST(CudaMemory, CapacityAppliesToTheSegmentsAGpuTakes) {
  MESHSIM_REQUIRE_CUDA();
  // The caching allocator serves a 4 MiB request from a 20 MiB segment (of which 16 MiB stay
  // free for later requests), and a 20 MiB one from a segment of its own: 40 MiB in all,
  // past a 24 MiB capacity.
  DeviceMesh mesh(card(2, int64_t{24} << 20));
  int64_t reserved_after_first = 0;
  EXPECT_THROW(run_ranks(mesh,
                         [&](RankContext& ctx) {
                           if (ctx.rank != 1)
                             return;
                           torch::Tensor fits = torch::empty({1 << 20}, torch::kCUDA);
                           reserved_after_first = ctx.gpu.reserved_bytes();
                           torch::Tensor not_fits = torch::empty({5 << 20}, torch::kCUDA);
                         }),
               OutOfMemory);
  EXPECT_EQ(reserved_after_first, int64_t{20} << 20);
  const std::string message = mesh.gpu(1).oom_message();
  EXPECT_NE(message.find("out of memory on gpu1"), std::string::npos) << message;
  EXPECT_NE(message.find("capacity 24.0 MiB"), std::string::npos) << message;
  EXPECT_LE(mesh.gpu(1).reserved_bytes(), int64_t{24} << 20);
  EXPECT_TRUE(mesh.gpu(0).oom_message().empty());
}

TEST(CudaMemory, HostTensorsOfACardRankAreNotItsMemory) {
  MESHSIM_REQUIRE_CUDA();
  DeviceMesh mesh(card(1, int64_t{1} << 30));
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::Tensor host = torch::ones({1000});
    EXPECT_EQ(ctx.gpu.current_bytes(), 0);
    torch::Tensor there = host.to(torch::kCUDA);
    EXPECT_EQ(ctx.gpu.current_bytes(), 4000);
  });
}

TEST(CudaMemory, WithoutACardTheReasonIsOneLine) {
  const CudaStatus s = cuda_status();
  if (s.usable)
    GTEST_SKIP() << "a card is present: " << s.name;
  EXPECT_FALSE(s.reason.empty());
  EXPECT_EQ(s.reason.find('\n'), std::string::npos) << s.reason;
  EXPECT_THROW(DeviceMesh(card(2, int64_t{1} << 20)), std::exception);
}
