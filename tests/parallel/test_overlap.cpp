// Overlapped communication, on the rank's communication thread (comm/comm_thread.h):
// DDP's bucket all-reduces (parallel/data/buckets.h) and ZeRO 2's reduce-scatters
// (parallel/data/zero.cpp) start during backward, and the run computes exactly what the blocking
// calls compute.
#include <gtest/gtest.h>

#include "data/text.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kOverlapSteps = 4;
constexpr int kOverlapWorld = 4;

HarnessRun run_ddp(bool overlap, torch::Dtype dtype, int zero = 0) {
  StrategyOptions o = tiny_gpt_sgd(dtype);  // several buckets
  o.overlap = overlap;
  o.zero = zero;
  static const Dataset text = synthetic_text(512, 16, 16, 64, 3).train;
  static std::vector<std::unique_ptr<DeviceMesh>> meshes;  // outlive the returned run
  meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(kOverlapWorld, int64_t{1} << 30)));
  torch::manual_seed(5);
  return run_strategy(*meshes.back(), "ddp", o, with_dtype(text, dtype), 16, kOverlapSteps);
}

// The same run with and without overlap: equal losses and parameters, bit for bit; without,
// every collective is a blocking call but ZeRO 3's prefetched gathers.
void expect_bit_for_bit_without_overlap(int zero) {
  const HarnessRun with = run_ddp(true, torch::kFloat32, zero);
  const HarnessRun without = run_ddp(false, torch::kFloat32, zero);
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t k = 0; k < with.losses.size(); ++k)
    EXPECT_EQ(with.losses[k], without.losses[k]) << "step " << k + 1;
  ASSERT_EQ(with.parameters.size(), without.parameters.size());
  for (size_t i = 0; i < with.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(with.parameters[i], without.parameters[i])) << "parameter " << i;
  // Nothing started ahead without overlap, but stage 3's gathers, prefetched either way.
  for (const Recorder& rec : without.recorders)
    for (const CollectiveRecord& x : rec.collectives)
      if (zero < 3 || x.op != "all_gather") {
        EXPECT_LT(x.waited_s, 0) << x.op << " #" << x.seq;
      }
}

} // namespace

TEST(DdpOverlap, BucketAllReducesStartBeforeBackwardEnds) {
  const HarnessRun run = run_ddp(true, torch::kFloat32);
  ASSERT_EQ(run.recorders.size(), static_cast<size_t>(kOverlapWorld));
  for (int r = 0; r < kOverlapWorld; ++r) {
    const Recorder& rec = run.recorders[r];
    int buckets = 0, early = 0;
    for (const CollectiveRecord& x : rec.collectives) {
      if (x.op != "all_reduce" || x.waited_s < 0)
        continue;  // not a bucket: blocking calls (the loss, the first broadcast) have none
      ++buckets;
      for (const ComputeRecord& c : rec.compute)
        if (c.name == "backward" && c.start_s <= x.start_s && x.start_s < c.end_s &&
            x.waited_s >= c.end_s)
          ++early;
    }
    // Every bucket of every step is asynchronous; some of them started while backward ran.
    EXPECT_GE(buckets, kOverlapSteps * 2) << "rank " << r;
    EXPECT_GT(early, 0) << "rank " << r << ": no bucket all-reduce started before backward ended";
  }
}

TEST(DdpOverlap, LossesAndParametersAreBitForBitThoseWithout) {
  expect_bit_for_bit_without_overlap(0);
}

TEST(ZeroOverlap, Stage2ReduceScattersRunDuringBackwardOneAtATime) {
  const HarnessRun run = run_ddp(true, torch::kFloat32, 2);
  ASSERT_EQ(run.recorders.size(), static_cast<size_t>(kOverlapWorld));
  for (int r = 0; r < kOverlapWorld; ++r) {
    const Recorder& rec = run.recorders[r];
    std::vector<const CollectiveRecord*> scatters;
    for (const CollectiveRecord& x : rec.collectives)
      if (x.op == "reduce_scatter")
        scatters.push_back(&x);
    ASSERT_GE(scatters.size(), static_cast<size_t>(kOverlapSteps * 2)) << "rank " << r;
    int during_backward = 0;
    for (size_t k = 0; k < scatters.size(); ++k) {
      const CollectiveRecord& x = *scatters[k];
      EXPECT_GE(x.waited_s, x.start_s) << "rank " << r << ": reduce_scatter #" << x.seq
                                       << " was not asynchronous";
      // Double buffering: the next one starts only once this one has been waited for.
      if (k + 1 < scatters.size()) {
        EXPECT_GE(scatters[k + 1]->start_s, x.waited_s) << "rank " << r << ": two in flight";
      }
      for (const ComputeRecord& c : rec.compute)
        if (c.name == "backward" && c.start_s <= x.start_s && x.start_s < c.end_s &&
            x.waited_s > x.start_s)
          ++during_backward;
    }
    EXPECT_GT(during_backward, 0) << "rank " << r << ": no reduce-scatter ran during backward";
  }
}

TEST(ZeroOverlap, Stage2LossesAndParametersAreBitForBitThoseWithout) {
  expect_bit_for_bit_without_overlap(2);
}

TEST(ZeroOverlap, Stage3LossesAndParametersAreBitForBitThoseWithout) {
  expect_bit_for_bit_without_overlap(3);
}
