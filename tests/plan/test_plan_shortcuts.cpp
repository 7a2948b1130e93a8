// What a plan skips because it would only repeat itself must change nothing it reports, to the
// byte and to the record:
//  - with few micro-batches a deep pipeline's middle stages after stage 1 are its images
//    (plan/stage_images.h): the plan equals one that runs every stage;
//  - on meta the ring of context parallelism runs one step of each kind and counts the charges
//    of the others (parallel/context/ring_attention.cpp): the plan equals one whose rings run
//    every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cost/hardware.h"
#include "cost/predict.h"
#include "parallel/context/context_parallel.h"
#include "plan/plan.h"

using namespace meshsim;

struct StageImageLayout {
  const char* name;
  const char* model;
  int gpus, pp, micro_batches;
  const char* schedule = "1f1b";
  int zero = 0, cp = 1, tp = 1;
  const char* cp_comm = "allgather";
  int64_t layers = 12;
  int first_stage_layers = 0, last_stage_layers = 0;
  bool pp_scatter_gather = false;
};

class PlanStageImages : public ::testing::TestWithParam<StageImageLayout> {};

namespace {

TrainConfig stage_image_config(const StageImageLayout& l) {
  TrainConfig c;
  c.model = l.model;
  c.data = "synthetic";
  c.precision = "bf16";
  c.gpus = l.gpus;
  c.pp = l.pp;
  c.tp = l.tp;
  c.cp = l.cp;
  c.cp_comm = l.cp_comm;
  c.zero = l.zero;
  c.schedule = l.schedule;
  c.micro_batches = l.micro_batches;
  c.first_stage_layers = l.first_stage_layers;
  c.last_stage_layers = l.last_stage_layers;
  c.pp_scatter_gather = l.pp_scatter_gather;
  c.shape.layers = l.layers;
  c.shape.seq_len = 64;
  c.batch_size = 6;
  c.progress = false;
  validate(c);
  return c;
}

void expect_same_records(const Recorder& a, const Recorder& b, const std::string& where) {
  ASSERT_EQ(a.collectives.size(), b.collectives.size()) << where;
  for (size_t i = 0; i < a.collectives.size(); ++i) {
    const CollectiveRecord &x = a.collectives[i], &y = b.collectives[i];
    EXPECT_EQ(x.op, y.op) << where << " record " << i;
    EXPECT_EQ(x.group, y.group) << where << " record " << i << " " << x.op;
    EXPECT_EQ(x.peer, y.peer) << where << " record " << i;
    EXPECT_EQ(x.bytes, y.bytes) << where << " record " << i;
    EXPECT_EQ(x.seq, y.seq) << where << " record " << i;
    EXPECT_EQ(x.start_charges, y.start_charges) << where << " record " << i;
  }
  ASSERT_EQ(a.compute.size(), b.compute.size()) << where;
  for (size_t i = 0; i < a.compute.size(); ++i) {
    EXPECT_EQ(a.compute[i].start_charges, b.compute[i].start_charges) << where << " region " << i;
    EXPECT_EQ(a.compute[i].end_charges, b.compute[i].end_charges) << where << " region " << i;
  }
}

// `fast` (with the shortcut) against `every` (without) of the same configuration.
void expect_same_plans(const Plan& fast, const Plan& every, int gpus, const std::string& name) {
  ASSERT_EQ(fast.ranks.size(), every.ranks.size());
  for (size_t i = 0; i < fast.ranks.size(); ++i) {
    const PlannedRank &a = fast.ranks[i], &b = every.ranks[i];
    const std::string where = name + " stage " + std::to_string(a.coord.pp);
    EXPECT_EQ(a.rank, b.rank) << where;
    EXPECT_EQ(a.stats.peak, b.stats.peak) << where;
    EXPECT_EQ(a.stats.peak_by_category, b.stats.peak_by_category) << where;
    EXPECT_EQ(a.model_state_bytes, b.model_state_bytes) << where;
    ASSERT_EQ(a.windows.size(), b.windows.size()) << where;
    for (size_t w = 0; w < a.windows.size(); ++w) {
      EXPECT_EQ(a.windows[w].phase, b.windows[w].phase) << where;
      EXPECT_EQ(a.windows[w].stats.peak, b.windows[w].stats.peak) << where << " " << a.windows[w].phase;
    }
    expect_same_records(fast.recorders[static_cast<size_t>(a.rank)],
                        every.recorders[static_cast<size_t>(b.rank)], where);
  }
  const ClusterSpec cluster = parse_cluster_spec("2x" + std::to_string(gpus / 2) + "xh100");
  PredictOptions options;
  options.images = true;
  options.dtype = Dtype::BF16;
  const Prediction p = predict(fast.recorders, fast.samples_per_step, cluster, options);
  const Prediction q = predict(every.recorders, every.samples_per_step, cluster, options);
  ASSERT_GT(q.step_time_s, 0);
  EXPECT_DOUBLE_EQ(p.step_time_s, q.step_time_s) << name;
  EXPECT_DOUBLE_EQ(p.exposed_comm_s, q.exposed_comm_s) << name;
  EXPECT_DOUBLE_EQ(p.flops, q.flops) << name;
  EXPECT_NEAR(p.bubble_fraction, q.bubble_fraction, 1e-12) << name;
}

} // namespace

TEST_P(PlanStageImages, EqualsAPlanThatRunsEveryStage) {
  const StageImageLayout l = GetParam();
  const TrainConfig c = stage_image_config(l);
  PlanRunOptions every_stage;
  every_stage.stage_images = false;
  const Plan fast = make_plan(c, int64_t{1} << 40);
  const Plan every = make_plan(c, int64_t{1} << 40, kPlanSteps, every_stage);
  const auto images = std::count_if(fast.ranks.begin(), fast.ranks.end(),
                                    [](const PlannedRank& r) { return r.image_of >= 0; });
  EXPECT_GT(images, 0) << l.name << ": no stage was an image";
  for (const PlannedRank& r : every.ranks)
    EXPECT_EQ(r.image_of, -1) << l.name;
  expect_same_plans(fast, every, l.gpus, l.name);
  // The memory timeline samples the stages that ran, one column per stage (bytes and
  // categories alike, not one per GPU of the cluster); an image's column is stage 1's.
  EXPECT_FALSE(fast.timeline.empty()) << l.name;
  for (const MemorySample& sample : fast.timeline) {
    ASSERT_EQ(sample.bytes.size(), fast.ranks.size()) << l.name;
    ASSERT_EQ(sample.by_category.size(), fast.ranks.size()) << l.name;
  }
  for (const MemorySample& sample : fast.timeline)
    for (size_t i = 0; i < fast.ranks.size(); ++i)
      if (fast.ranks[i].image_of >= 0) {
        EXPECT_EQ(sample.bytes[i], sample.bytes[1]) << l.name << " " << sample.phase;
      }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlanStageImages,
    ::testing::Values(
        StageImageLayout{"gpt_pp6_one_micro_batch", "gpt", 6, 6, 1},
        StageImageLayout{"gpt_pp6_two_micro_batches", "gpt", 6, 6, 2},
        StageImageLayout{"gpt_pp6_gpipe_three", "gpt", 6, 6, 3, "gpipe"},
        StageImageLayout{"gpt_pp6_dp2_zero3", "gpt", 12, 6, 2, "1f1b", 3},
        StageImageLayout{"gpt_pp6_tp2_zero1", "gpt", 12, 6, 1, "1f1b", 1, 1, 2},
        StageImageLayout{"gpt_pp6_tp2_messages_scattered", "gpt", 12, 6, 2, "1f1b", 1, 1, 2,
                         "allgather", 12, 0, 0, true},
        StageImageLayout{"llama_pp6_cp2_ring", "llama", 12, 6, 2, "1f1b", 0, 2, 1, "ring"},
        StageImageLayout{"llama_pp8_cp2_allgather_zero3", "llama", 16, 8, 2, "1f1b", 3, 2, 1,
                         "allgather", 16},
        StageImageLayout{"gpt_pp6_first_and_last_stage_layers", "gpt", 6, 6, 2, "1f1b", 0, 1, 1,
                         "allgather", 10, 1, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// Context parallelism by ring on meta: one step of each kind runs (rank 0 of a cp group has
// its own block and C - 1 later ones), the others count its charges.
struct RingLayout {
  const char* name;
  const char* model;
  int gpus, cp, pp = 1, zero = 0, tp = 1;
  const char* attention = "fused";
  bool sequence_parallel = false;
};

class PlanRingSteps : public ::testing::TestWithParam<RingLayout> {};

TEST_P(PlanRingSteps, EqualsAPlanWhoseRingsRunEveryStep) {
  const RingLayout l = GetParam();
  TrainConfig c;
  c.model = l.model;
  c.data = "synthetic";
  c.precision = "bf16";
  c.gpus = l.gpus;
  c.cp = l.cp;
  c.cp_comm = "ring";
  c.pp = l.pp;
  c.tp = l.tp;
  c.sequence_parallel = l.sequence_parallel;
  c.zero = l.zero;
  c.attention = l.attention;
  c.micro_batches = l.pp;
  c.shape.layers = 2 * l.pp;
  c.shape.seq_len = 128;
  c.batch_size = 2 * l.pp;
  c.progress = false;
  validate(c);
  const Plan fast = make_plan(c, int64_t{1} << 40);
  Plan every;
  {
    const RingRunsEveryStep all;
    every = make_plan(c, int64_t{1} << 40);
  }
  expect_same_plans(fast, every, l.gpus, l.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlanRingSteps,
    ::testing::Values(RingLayout{"llama_cp4", "llama", 4, 4},
                      RingLayout{"llama_cp8_fused", "llama", 8, 8},
                      RingLayout{"gpt_cp4_eager", "gpt", 4, 4, 1, 0, 1, "eager"},
                      RingLayout{"llama_cp4_tp2_sp", "llama", 8, 4, 1, 0, 2, "fused", true},
                      RingLayout{"llama_cp4_pp2_dp2_zero3", "llama", 16, 4, 2, 3}),
    [](const auto& info) { return std::string(info.param.name); });
