// DDP's overlap (parallel/buckets.h): each bucket's all-reduce starts during backward, on
// the rank's communication thread (comm/comm_thread.h), and the run computes exactly what
// all-reducing after backward computes.
#include <gtest/gtest.h>

#include "data/text.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kOverlapSteps = 4;
constexpr int kOverlapWorld = 4;

HarnessRun run_ddp(bool overlap, torch::Dtype dtype) {
  StrategyOptions o = tiny_gpt_sgd(dtype);  // several buckets
  o.overlap = overlap;
  static const Dataset text = synthetic_text(512, 16, 16, 64, 3).train;
  static std::vector<std::unique_ptr<DeviceMesh>> meshes;  // outlive the returned run
  meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(kOverlapWorld, int64_t{1} << 30)));
  torch::manual_seed(5);
  return run_strategy(*meshes.back(), "ddp", o, with_dtype(text, dtype), 16, kOverlapSteps);
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
  const HarnessRun with = run_ddp(true, torch::kFloat32);
  const HarnessRun without = run_ddp(false, torch::kFloat32);
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t k = 0; k < with.losses.size(); ++k)
    EXPECT_EQ(with.losses[k], without.losses[k]) << "step " << k + 1;
  ASSERT_EQ(with.parameters.size(), without.parameters.size());
  for (size_t i = 0; i < with.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(with.parameters[i], without.parameters[i])) << "parameter " << i;
  // Without overlap, every collective is a blocking call.
  for (const Recorder& rec : without.recorders)
    for (const CollectiveRecord& x : rec.collectives)
      EXPECT_LT(x.waited_s, 0) << x.op << " #" << x.seq;
}
