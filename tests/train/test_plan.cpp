// Plans: a step run on the meta device charges every GPU exactly what a real training run on
// CPU holds, by category, for every layout; the replicas a plan does not run get the executed
// ranks' records under their own ranks.
#include <gtest/gtest.h>

#include "data/text.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace meshsim {
namespace {

TEST(ReplicateReplicas, RenamesRanksWithinAReplicaAndKeepsGroupsAcrossThem) {
  // dp 2 × tp 2 × pp 2: replica 0 is ranks 0, 1 (stage 0) and 4, 5 (stage 1).
  const ParallelDims dims = ParallelDims::make(8, 2, 2);
  std::vector<Recorder> executed(8);
  CollectiveRecord tp;
  tp.op = "all_reduce";
  tp.group = {0, 1};
  CollectiveRecord dp;
  dp.op = "all_reduce";
  dp.group = {0, 2};
  CollectiveRecord send;
  send.op = "send";
  send.group = {0, 4};
  send.peer = 4;
  executed[0].collectives = {tp, dp, send};
  executed[0].compute.push_back(ComputeRecord{"forward", 1, 0.0, 1.0});
  const std::vector<Recorder> all = replicate_replicas(executed, dims);
  ASSERT_EQ(all.size(), 8u);
  // Rank 2 is (dp 1, tp 0, pp 0): rank 0's image.
  const Recorder& r2 = all[2];
  ASSERT_EQ(r2.collectives.size(), 3u);
  EXPECT_EQ(r2.collectives[0].group, (std::vector<int>{2, 3}));
  EXPECT_EQ(r2.collectives[1].group, (std::vector<int>{0, 2})); // the dp group spans replicas
  EXPECT_EQ(r2.collectives[2].peer, 6);
  EXPECT_EQ(r2.collectives[2].group, (std::vector<int>{2, 6}));
  ASSERT_EQ(r2.compute.size(), 1u);
  EXPECT_EQ(all[0].collectives[0].group, (std::vector<int>{0, 1}));
}

struct Layout {
  const char* name;
  int gpus, tp, pp, zero, micro_batches;
};

class PlanMatchesTraining : public ::testing::TestWithParam<Layout> {};

// The same configuration planned on meta tensors and trained on CPU: every executed rank's
// peak bytes of every category are equal (no tolerance: both count the same tensors).
TEST_P(PlanMatchesTraining, PeakBytesByCategoryPerGpu) {
  const Layout l = GetParam();
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.gpus = l.gpus;
  c.tp = l.tp;
  c.pp = l.pp;
  c.zero = l.zero;
  c.micro_batches = l.micro_batches;
  c.batch_size = 8;
  c.max_steps = kPlanSteps;
  c.synthetic_train = 256;
  c.synthetic_test = 16;
  c.eval_limit = 16;
  c.progress = false;
  c.gpt.vocab = 256;
  validate(c);

  const Plan plan = make_plan(c, int64_t{1} << 40);

  MeshOptions mo;
  mo.world_size = c.gpus;
  mo.capacity_bytes = int64_t{1} << 32;
  DeviceMesh mesh(mo);
  const DataSplit data =
      synthetic_text(c.synthetic_train, c.synthetic_test, c.gpt.seq_len, c.gpt.vocab, c.seed);
  train(c, mesh, data, nullptr);

  ASSERT_FALSE(plan.ranks.empty());
  for (const PlannedRank& p : plan.ranks) {
    const MemoryStats real = mesh.gpu(p.rank).stats();
    for (int k = 0; k < kNumCategories; ++k)
      EXPECT_EQ(p.stats.peak_by_category[static_cast<size_t>(k)],
                real.peak_by_category[static_cast<size_t>(k)])
          << l.name << ": gpu" << p.rank << " "
          << category_name(static_cast<MemoryCategory>(k));
    EXPECT_EQ(p.stats.peak, real.peak) << l.name << ": gpu" << p.rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlanMatchesTraining,
                         ::testing::Values(Layout{"ddp", 4, 1, 1, 0, 1},
                                           Layout{"zero3", 4, 1, 1, 3, 1},
                                           Layout{"tp2", 4, 2, 1, 0, 1},
                                           Layout{"pp2_1f1b", 4, 1, 2, 0, 4},
                                           Layout{"mesh_2x2x2_zero1", 8, 2, 2, 1, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

} // namespace
} // namespace meshsim
