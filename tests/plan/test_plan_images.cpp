// A plan replays only the GPUs it executed, one per symmetry class, treating the others as
// their images: the prediction must equal replaying every GPU from replicated records.
#include <gtest/gtest.h>

#include "cost/hardware.h"
#include "cost/predict.h"
#include "plan/plan.h"

using namespace meshsim;

// Outside the anonymous namespace: the tests derive from PlanImages.
struct ImageLayout {
  const char* name;
  int gpus, tp, pp, zero, micro_batches;
  int dp_shard = 0; // HSDP: ZeRO shards within this many dp ranks (0: all of dp)
};

class PlanImages : public ::testing::TestWithParam<ImageLayout> {};

namespace {

// The layout as a validated configuration of the tiny GPT.
TrainConfig image_config_of(const ImageLayout& l, const char* precision = "fp32") {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.precision = precision;
  c.gpus = l.gpus;
  c.tp = l.tp;
  c.pp = l.pp;
  c.zero = l.zero;
  c.micro_batches = l.micro_batches;
  c.dp_shard = l.dp_shard;
  c.batch_size = 8;
  c.progress = false;
  validate(c);
  return c;
}

} // namespace

TEST_P(PlanImages, ReplayingTheExecutedGpusEqualsReplayingEveryGpu) {
  const ImageLayout l = GetParam();
  const Plan plan = make_plan(image_config_of(l), int64_t{1} << 40);
  // Two nodes, so that tp, dp and pp groups cross the slow link or not as in a real cluster.
  const ClusterSpec cluster = parse_cluster_spec("2x" + std::to_string(l.gpus / 2) + "xa100-80");

  PredictOptions every;
  const Prediction full = predict(replicate_replicas(plan.recorders, plan.dims),
                                  plan.samples_per_step, cluster, every);
  PredictOptions images;
  images.images = true;
  const Prediction fast = predict(plan.recorders, plan.samples_per_step, cluster, images);

  ASSERT_GT(full.step_time_s, 0);
  EXPECT_DOUBLE_EQ(fast.step_time_s, full.step_time_s) << l.name;
  EXPECT_DOUBLE_EQ(fast.tflops_per_gpu, full.tflops_per_gpu) << l.name;
  EXPECT_DOUBLE_EQ(fast.exposed_comm_s, full.exposed_comm_s) << l.name;
  EXPECT_NEAR(fast.bubble_fraction, full.bubble_fraction, 1e-12) << l.name;
  EXPECT_DOUBLE_EQ(fast.compute_s, full.compute_s) << l.name;
  EXPECT_DOUBLE_EQ(fast.comm_s, full.comm_s) << l.name;
  // The replay covered the executed GPUs only.
  size_t replayed = 0;
  for (const auto& rank : fast.program.ranks)
    replayed += !rank.empty();
  EXPECT_EQ(replayed, static_cast<size_t>(l.pp)) << l.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlanImages,
                         ::testing::Values(ImageLayout{"dp4", 4, 1, 1, 0, 1},
                                           ImageLayout{"tp2_dp2", 4, 2, 1, 0, 1},
                                           ImageLayout{"pp2_1f1b", 4, 1, 2, 0, 4},
                                           ImageLayout{"mesh_zero1", 8, 2, 2, 1, 2},
                                           ImageLayout{"zero2", 4, 1, 1, 2, 1},
                                           ImageLayout{"zero3", 4, 1, 1, 3, 1},
                                           ImageLayout{"mesh_zero3", 8, 2, 2, 3, 2},
                                           ImageLayout{"hsdp_zero3", 8, 1, 1, 3, 1, 2},
                                           ImageLayout{"hsdp_pp2_zero2", 8, 1, 2, 2, 2, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

// A plan's steps after the first change nothing it reports: every executed GPU's peak bytes by
// category and its model state are those of the first step (everything a step keeps is
// allocated before its first peak), and the replayed step is the same.
TEST_P(PlanImages, LaterStepsChangeNoPeak) {
  const ImageLayout l = GetParam();
  for (const char* precision : {"fp32", "bf16"}) {
    const TrainConfig c = image_config_of(l, precision);
    const Plan one = make_plan(c, int64_t{1} << 40, 1);
    const Plan three = make_plan(c, int64_t{1} << 40, 3);
    ASSERT_EQ(one.ranks.size(), three.ranks.size());
    for (size_t i = 0; i < one.ranks.size(); ++i) {
      EXPECT_EQ(one.ranks[i].stats.peak_by_category, three.ranks[i].stats.peak_by_category)
          << l.name << " " << precision << " gpu" << one.ranks[i].rank;
      EXPECT_EQ(one.ranks[i].stats.peak, three.ranks[i].stats.peak) << l.name << " " << precision;
      EXPECT_EQ(one.ranks[i].model_state_bytes, three.ranks[i].model_state_bytes) << l.name;
    }
  }
}
