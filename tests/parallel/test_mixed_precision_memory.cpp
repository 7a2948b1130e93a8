// Mixed precision's memory contract (docs/zero.md): with bf16 parameters and gradients and
// fp32 master weights and Adam moments, every GPU holds between steps exactly the ZeRO
// paper's model states (Rajbhandari et al. 2020, §3 and Table 1, K = 12): 2Ψ + 2Ψ + 12Ψ =
// 16Ψ for stage 0, 4Ψ + 12Ψ/N for stage 1, 2Ψ + 14Ψ/N for stage 2, 16Ψ/N for stage 3; and
// plain DDP holds 16Ψ (Adam) or 2Ψ + 2Ψ + 8Ψ (SGD: master and momentum).
//
// The ZeRO model is three Linear layers whose every block size is divisible by 2 and 4, so
// the flat buffers need no padding and the formulas hold to the byte for N = 2 and N = 4.
#include <gtest/gtest.h>

#include <iostream>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "parallel/strategy.h"
#include "parallel/data/zero.h"
#include "strategy_harness.h"

using namespace meshsim;

namespace {

constexpr int64_t kMixedPsi = (64 * 128 + 128) + (128 * 128 + 128) + (128 * 16 + 16); // 26,896

torch::nn::Sequential bf16_mlp() {
  static std::mutex mutex; // initialization draws from the global generator
  std::lock_guard<std::mutex> lock(mutex);
  ensure_kernels_for(torch::kBFloat16);
  torch::manual_seed(7);
  torch::nn::Sequential m;
  m->push_back("fc1", torch::nn::Linear(64, 128));
  m->push_back("relu1", torch::nn::ReLU());
  m->push_back("fc2", torch::nn::Linear(128, 128));
  m->push_back("relu2", torch::nn::ReLU());
  m->push_back("fc3", torch::nn::Linear(128, 16));
  m->to(torch::kBFloat16);
  return m;
}

int64_t mixed_current(const VirtualGpu& gpu, MemoryCategory c) {
  return gpu.stats().current_by_category[static_cast<size_t>(c)];
}

struct ModelStates {
  int64_t parameters, gradients, optimizer;
  int64_t total() const { return parameters + gradients + optimizer; }
};

/// The ZeRO paper's split for mixed-precision Adam: 2 bytes of parameters, 2 of gradients,
/// K = 12 of optimizer state (fp32 master 4, momentum 4, variance 4) per parameter.
ModelStates zero_paper(int stage, int n) {
  switch (stage) {
  case 0:
    return {2 * kMixedPsi, 2 * kMixedPsi, 12 * kMixedPsi};
  case 1:
    return {2 * kMixedPsi, 2 * kMixedPsi, 12 * kMixedPsi / n};
  case 2:
    return {2 * kMixedPsi, 2 * kMixedPsi / n, 12 * kMixedPsi / n};
  default:
    return {2 * kMixedPsi / n, 2 * kMixedPsi / n, 12 * kMixedPsi / n};
  }
}

/// The totals exactly as the paper writes them.
int64_t zero_paper_total(int stage, int n) {
  switch (stage) {
  case 0:
    return 16 * kMixedPsi;
  case 1:
    return 4 * kMixedPsi + 12 * kMixedPsi / n;
  case 2:
    return 2 * kMixedPsi + 14 * kMixedPsi / n;
  default:
    return 16 * kMixedPsi / n;
  }
}

void check_zero(int stage, int n, bool reduce_fp32 = false) {
  static_assert(kMixedPsi % 4 == 0, "Ψ divisible by N: the formulas carry no rounding");
  DeviceMesh mesh([n] {
    MeshOptions o;
    o.world_size = n;
    o.capacity_bytes = int64_t{256} << 20;
    return o;
  }());
  ModelStates want = zero_paper(stage, n);
  ASSERT_EQ(want.total(), zero_paper_total(stage, n));
  // Stage 1 reduced in fp32: the flat gradient is fp32, 2Ψ more than the paper's bf16 one.
  const int64_t fp32_gradients = reduce_fp32 && stage <= 1 ? 2 * kMixedPsi : 0;
  want.gradients += fp32_gradients;
  std::mutex print;
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::nn::Sequential model;
    {
      CategoryScope scope(MemoryCategory::Parameters);
      model = bf16_mlp();
    }
    ZeroOptions options{stage, 0.04, {}};
    options.reduce_fp32 = reduce_fp32;
    ZeroDataParallel zero(ctx, model, Group::world(n), options);
    ASSERT_EQ(zero.flat_bytes(), 2 * kMixedPsi); // bf16, and no padding with these sizes
    auto check = [&](const std::string& when) {
      const ModelStates got{mixed_current(ctx.gpu, MemoryCategory::Parameters),
                            mixed_current(ctx.gpu, MemoryCategory::Gradients),
                            mixed_current(ctx.gpu, MemoryCategory::Optimizer)};
      EXPECT_EQ(got.parameters, want.parameters) << when << " gpu" << ctx.rank;
      EXPECT_EQ(got.gradients, want.gradients) << when << " gpu" << ctx.rank;
      EXPECT_EQ(got.optimizer, want.optimizer) << when << " gpu" << ctx.rank;
      EXPECT_EQ(got.total(), zero_paper_total(stage, n) + fp32_gradients)
          << when << " gpu" << ctx.rank;
    };
    check("after construction");
    torch::Generator gen = at::detail::createCPUGenerator(100 + ctx.rank);
    for (int k = 1; k <= 3; ++k) {
      zero.zero_grad();
      {
        CategoryScope scope(MemoryCategory::Activations);
        torch::Tensor x = torch::randn({8, 64}, gen, torch::kFloat32).to(torch::kBFloat16);
        torch::Tensor y = torch::randint(0, 16, {8}, gen, torch::kLong);
        loss_fn(zero.module()->forward(x), y).backward();
      }
      zero.finish_gradients(k);
      zero.step(k);
      check(fmt::format("after step {}", k));
    }
    if (ctx.rank == 0) {
      std::lock_guard<std::mutex> lock(print);
      std::cout << fmt::format("bf16 adam, zero {}{} N {}: parameters {} gradients {} "
                               "optimizer {} = {} bytes ({:.2f} per parameter)\n",
                               stage, reduce_fp32 ? " reduced in fp32" : "", n,
                               want.parameters, want.gradients, want.optimizer, want.total(),
                               static_cast<double>(want.total()) / kMixedPsi);
    }
  });
}

} // namespace

TEST(MixedPrecisionMemory, ZeroStagesMatchTheZeroPaperAtN2) {
  for (int stage = 0; stage <= 3; ++stage)
    check_zero(stage, 2);
}

TEST(MixedPrecisionMemory, ZeroStagesMatchTheZeroPaperAtN4) {
  for (int stage = 0; stage <= 3; ++stage)
    check_zero(stage, 4);
}

// --reduce-fp32: stage 1's flat gradient is fp32 (4Ψ, as Megatron's main_grad: 6Ψ + 12Ψ/N in
// all), stage 2's and 3's shards stay bf16 (their fp32 buckets live only while they are
// reduce-scattered).
TEST(MixedPrecisionMemory, ReducedInFp32OnlyStageOnesGradientIsFp32) {
  for (int stage = 1; stage <= 3; ++stage)
    check_zero(stage, 4, /*reduce_fp32=*/true);
}

// `--strategy ddp` without --zero (its own buckets, no flat units): whatever Ψ is, 2Ψ of bf16
// parameters, 2Ψ of bf16 gradients, and fp32 state: 12Ψ with Adam, 8Ψ with SGD + momentum
// (master 4, momentum 4), 4Ψ with plain SGD (master only).
TEST(MixedPrecisionMemory, DdpHoldsTwoPlusTwoPlusOptimizerState) {
  const auto data = synthetic_dataset(256, 16, 11).train;
  for (const auto& [name, momentum, state_bytes] :
       {std::tuple<std::string, double, int64_t>{"adam", 0.9, 12},
        {"sgd", 0.9, 8},
        {"sgd", 0.0, 4}}) {
    StrategyOptions o;
    o.model = "cnn";
    o.precision = "bf16";
    o.optimizer.name = name;
    o.optimizer.momentum = momentum;
    DeviceMesh mesh([] {
      MeshOptions m;
      m.world_size = 2;
      m.capacity_bytes = int64_t{1} << 30;
      return m;
    }());
    std::vector<int64_t> psi(2, 0);
    meshsim::testing::run_strategy(
        mesh, "ddp", o, data, 32, 2, [&](RankContext& ctx, Strategy& s, int step) {
          int64_t n = 0;
          for (const auto& p : s.model()->parameters()) {
            EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
            n += p.numel();
          }
          psi[ctx.rank] = n;
          EXPECT_EQ(mixed_current(ctx.gpu, MemoryCategory::Parameters), 2 * n);
          EXPECT_EQ(mixed_current(ctx.gpu, MemoryCategory::Gradients), 2 * n);
          EXPECT_EQ(mixed_current(ctx.gpu, MemoryCategory::Optimizer), state_bytes * n)
              << name << " momentum " << momentum;
        });
    EXPECT_EQ(psi[0], 421642); // the CNN
  }
}
