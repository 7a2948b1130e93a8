// ZeRO's memory contract, exactly: with fp32 Adam and Ψ parameters, between steps every GPU
// holds parameters + gradients + optimizer of 16Ψ (stage 0), 8Ψ + 8Ψ/dp (1), 4Ψ + 12Ψ/dp (2)
// and 16Ψ/dp (3); inside a step, stage 2's gradients never exceed 4Ψ/dp (the buckets are
// communication: the one in flight, its reduce-scattered part, the one filling) and stage 3's parameters
// never exceed 4Ψ/dp plus the largest gathered block.
//
// The model is three Linear layers whose every parameter size is divisible by 4, so no
// padding occurs and the formulas hold to the byte.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "parallel/strategy.h"
#include "parallel/data/zero.h"

using namespace meshsim;

namespace {

constexpr int kZeroDp = 4;
constexpr int64_t kZeroPsi = (64 * 128 + 128) + (128 * 128 + 128) + (128 * 16 + 16); // 26,896
constexpr int64_t kLargestBlockBytes = 4 * (128 * 128 + 128); // fc2: 66,048
constexpr int64_t kFc1Bytes = 4 * (64 * 128 + 128);            // 33,280

torch::nn::Sequential mlp() {
  // Initialization draws from the global generator; rank threads must not race on it.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(7);
  torch::nn::Sequential m;
  m->push_back("fc1", torch::nn::Linear(64, 128));
  m->push_back("relu1", torch::nn::ReLU());
  m->push_back("fc2", torch::nn::Linear(128, 128));
  m->push_back("relu2", torch::nn::ReLU());
  m->push_back("fc3", torch::nn::Linear(128, 16));
  return m;
}

int64_t current(const VirtualGpu& gpu, MemoryCategory c) {
  return gpu.stats().current_by_category[static_cast<size_t>(c)];
}
int64_t zero_peak(const VirtualGpu& gpu, MemoryCategory c) {
  return gpu.stats().peak_by_category[static_cast<size_t>(c)];
}

struct Expected {
  int64_t parameters, gradients, optimizer;
};

Expected expected(int stage) {
  const int64_t p = 4 * kZeroPsi, g = 4 * kZeroPsi, o = 8 * kZeroPsi;
  switch (stage) {
  case 0:
    return {p, g, o};
  case 1:
    return {p, g, o / kZeroDp};
  case 2:
    return {p, g / kZeroDp, o / kZeroDp};
  default:
    return {p / kZeroDp, g / kZeroDp, o / kZeroDp};
  }
}

/// The collectives of one step on each member: op -> {calls, input bytes} (docs/zero.md).
std::map<std::string, std::pair<int64_t, int64_t>> collectives_per_step(int stage, int micro) {
  const int64_t units = 3, full = 4 * kZeroPsi, shard = full / kZeroDp;
  switch (stage) {
  case 0:
    return {{"all_reduce", {units, full}}};
  case 1:
    return {{"all_reduce", {units, full}}, {"all_gather", {units, shard}}};
  case 2:
    return {{"reduce_scatter", {units * micro, full * micro}}, {"all_gather", {units, shard}}};
  default:
    return {{"all_gather", {2 * units * micro, 2 * shard * micro}},
            {"reduce_scatter", {units * micro, full * micro}}};
  }
}

void check_stage(int stage, int micro) {
  DeviceMesh mesh([] {
    MeshOptions o;
    o.world_size = kZeroDp;
    o.capacity_bytes = int64_t{256} << 20;
    return o;
  }());
  const Expected want = expected(stage);
  std::mutex print;
  const auto recorders = run_ranks(mesh, [&](RankContext& ctx) {
    torch::nn::Sequential model;
    {
      CategoryScope scope(MemoryCategory::Parameters);
      model = mlp();
    }
    // 0.04 MiB: fc3 (8 KiB) and fc2 (64.5 KiB) do not fit one bucket, so there are three.
    ZeroDataParallel zero(ctx, model, Group::world(kZeroDp), ZeroOptions{stage, 0.04, {}});
    ASSERT_EQ(zero.flat_bytes(), 4 * kZeroPsi); // no padding with these sizes
    ASSERT_EQ(zero.largest_unit_bytes(), kLargestBlockBytes);
    auto check_between_steps = [&](const std::string& when) {
      EXPECT_EQ(current(ctx.gpu, MemoryCategory::Parameters), want.parameters)
          << when << " gpu" << ctx.rank;
      EXPECT_EQ(current(ctx.gpu, MemoryCategory::Gradients), want.gradients)
          << when << " gpu" << ctx.rank;
      EXPECT_EQ(current(ctx.gpu, MemoryCategory::Optimizer), want.optimizer)
          << when << " gpu" << ctx.rank;
      EXPECT_EQ(current(ctx.gpu, MemoryCategory::Communication), 0) << when << " gpu" << ctx.rank;
    };
    check_between_steps("after construction");
    ctx.gpu.reset_peaks(); // measure the steps alone
    torch::Generator gen = at::detail::createCPUGenerator(100 + ctx.rank);
    for (int k = 1; k <= 3; ++k) {
      zero.zero_grad();
      for (int m = 0; m < micro; ++m) {
        CategoryScope scope(MemoryCategory::Activations);
        torch::Tensor x = torch::randn({8, 64}, gen, torch::kFloat32);
        torch::Tensor y = torch::randint(0, 16, {8}, gen, torch::kLong);
        torch::Tensor loss = loss_fn(zero.module()->forward(x), y) / micro;
        loss.backward();
      }
      zero.finish_gradients(k);
      zero.step(k);
      check_between_steps(fmt::format("after step {}", k));
    }
    const int64_t peak_params = zero_peak(ctx.gpu, MemoryCategory::Parameters);
    const int64_t peak_grads = zero_peak(ctx.gpu, MemoryCategory::Gradients);
    const int64_t peak_comm = zero_peak(ctx.gpu, MemoryCategory::Communication);
    EXPECT_EQ(peak_grads, want.gradients) << "gpu" << ctx.rank; // all stages: never above steady
    EXPECT_EQ(zero_peak(ctx.gpu, MemoryCategory::Optimizer), want.optimizer) << "gpu" << ctx.rank;
    if (stage < 3) {
      EXPECT_EQ(peak_params, want.parameters) << "gpu" << ctx.rank;
    } else {
      // A block's parameters and the next block's, prefetched beside its compute: at most two
      // neighbours at once, fc1 with fc2 (or fc2 with fc3, less).
      EXPECT_EQ(peak_params, want.parameters + kFc1Bytes + kLargestBlockBytes)
          << "gpu" << ctx.rank;
    }
    // Stage 1: one unit's all-gathered shards; stage 0 reduces in place. Stages 2 and 3,
    // exactly: when backward completes fc1's bucket, fc2's reduce-scatter (bucket and part) is
    // still in flight; waiting for it before starting fc1's is what keeps it to two buckets
    // (stage 3 gathers into the parameters themselves, under `parameters`).
    if (stage >= 2) {
      EXPECT_EQ(peak_comm, kLargestBlockBytes + kLargestBlockBytes / kZeroDp + kFc1Bytes)
          << "gpu" << ctx.rank;
    } else {
      const int64_t comm_bound =
          stage == 0 ? 0 : kLargestBlockBytes + kLargestBlockBytes / kZeroDp;
      EXPECT_LE(peak_comm, comm_bound) << "gpu" << ctx.rank;
    }
    if (ctx.rank == 0) {
      std::lock_guard<std::mutex> lock(print);
      std::cout << fmt::format(
          "zero stage {} dp {} micro {} gpu0 between steps: parameters {} gradients {} optimizer "
          "{} "
          "(total {} = {:.3f} bytes/param); peaks in step: parameters {} gradients {} "
          "communication {}\n",
          stage, kZeroDp, micro, want.parameters, want.gradients, want.optimizer,
          want.parameters + want.gradients + want.optimizer,
          static_cast<double>(want.parameters + want.gradients + want.optimizer) / kZeroPsi,
          peak_params, peak_grads, peak_comm);
    }
  });

  // Every member: the construction's broadcasts (one per unit), then per step exactly the
  // collectives of the table in docs/zero.md; and memory.csv has the phases.
  constexpr int kSteps = 3;
  for (int r = 0; r < kZeroDp; ++r) {
    std::map<std::string, std::pair<int64_t, int64_t>> got;
    for (const auto& c : recorders[r].collectives) {
      got[c.op].first += 1;
      got[c.op].second += c.bytes;
    }
    EXPECT_EQ(got["broadcast"], std::make_pair(int64_t{3}, 4 * kZeroPsi)) << "gpu" << r;
    got.erase("broadcast");
    auto want_calls = collectives_per_step(stage, micro);
    for (auto& [op, calls] : want_calls)
      calls = {calls.first * kSteps, calls.second * kSteps};
    EXPECT_EQ(got, want_calls) << "stage " << stage << " gpu" << r;
  }
  std::set<std::string> phases;
  for (const auto& sample : mesh.timeline().samples())
    phases.insert(sample.phase);
  for (const auto& [op, calls] : collectives_per_step(stage, micro))
    EXPECT_TRUE(phases.count(op)) << "memory.csv has no phase " << op;
  EXPECT_TRUE(phases.count("optimizer"));
}

} // namespace

TEST(ZeroMemory, Stage0HoldsSixteenBytesPerParameter) {
  check_stage(0, 1);
}
TEST(ZeroMemory, Stage1ShardsOptimizerState) {
  check_stage(1, 1);
}
TEST(ZeroMemory, Stage2ShardsGradients) {
  check_stage(2, 1);
}
TEST(ZeroMemory, Stage3ShardsParameters) {
  check_stage(3, 1);
}
TEST(ZeroMemory, Stage2And3BoundsHoldWithTwoMicroBatches) {
  check_stage(2, 2);
  check_stage(3, 2);
}
