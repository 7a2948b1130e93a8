// The predicted step per stage (plan/step_timeline.h): compute, exposed communication and
// bubble split exactly, against intervals worked by hand and against the replay's own totals.
#include <gtest/gtest.h>

#include "cost/hardware.h"
#include "plan/plan.h"
#include "plan/step_timeline.h"

using namespace meshsim;

namespace {

double total(const StageTimeline& t, StepActivity what) {
  double sum = 0;
  for (const StepSegment& s : t.segments)
    if (s.activity == what)
      sum += s.end_s - s.start_s;
  return sum;
}

} // namespace

// compute [0, 1) and [2, 3); communication [0.5, 2.5); a step of 4: the communication under
// compute is hidden, [1, 2) is exposed, [3, 4) is idle.
TEST(StepTimeline, SplitsAStepByHand) {
  const StageTimeline t = split_step({{2, 3}, {0, 1}}, {{0.5, 2.5}}, 4);
  EXPECT_DOUBLE_EQ(t.compute_s, 2);
  EXPECT_DOUBLE_EQ(t.exposed_comm_s, 1);
  EXPECT_DOUBLE_EQ(t.bubble_s, 1);
  ASSERT_EQ(t.segments.size(), 4u);
  const StepActivity expected[] = {StepActivity::Compute, StepActivity::ExposedComm,
                                   StepActivity::Compute, StepActivity::Bubble};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(t.segments[i].start_s, static_cast<double>(i));
    EXPECT_DOUBLE_EQ(t.segments[i].end_s, static_cast<double>(i + 1));
    EXPECT_EQ(t.segments[i].activity, expected[i]) << i;
  }
}

// Overlapping and touching intervals merge; nothing outside [0, step] counts.
TEST(StepTimeline, MergesOverlapsAndClipsToTheStep) {
  const StageTimeline t = split_step({{0, 1}, {0.5, 2}, {2, 3}, {5, 9}}, {{-1, 0.5}, {2.5, 4}}, 4);
  EXPECT_DOUBLE_EQ(t.compute_s, 3);
  EXPECT_DOUBLE_EQ(t.exposed_comm_s, 1);
  EXPECT_DOUBLE_EQ(t.bubble_s, 0);
  ASSERT_EQ(t.segments.size(), 2u);
  EXPECT_DOUBLE_EQ(t.segments[0].end_s, 3);
}

// More changes than segments allowed: equal slices, each what filled most of it; the totals
// stay exact, the slices cover the step.
TEST(StepTimeline, ManyChangesBecomeSlicesWithExactTotals) {
  std::vector<std::pair<double, double>> compute, comm;
  for (int i = 0; i < 1000; ++i) {
    compute.emplace_back(i, i + 0.7);    // 700 of compute
    comm.emplace_back(i + 0.7, i + 0.9); // 200 exposed, 100 idle
  }
  const StageTimeline t = split_step(compute, comm, 1000, 100);
  EXPECT_NEAR(t.compute_s, 700, 1e-9);
  EXPECT_NEAR(t.exposed_comm_s, 200, 1e-9);
  EXPECT_NEAR(t.bubble_s, 100, 1e-9);
  // Every 10-wide slice is 70 % compute: one segment of compute.
  ASSERT_EQ(t.segments.size(), 1u);
  EXPECT_EQ(t.segments[0].activity, StepActivity::Compute);
  EXPECT_DOUBLE_EQ(t.segments[0].end_s, 1000);
}

// A pipeline's plan: each stage's totals are the replay's own (RankStats) and add up to the
// step; the segments, exact here, add up to the totals.
TEST(StepTimeline, APipelinesStagesMatchTheReplay) {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.gpus = 8;
  c.tp = 2;
  c.pp = 2;
  c.micro_batches = 4;
  c.batch_size = 8;
  c.shape.layers = 4;
  c.shape.hidden = 256;
  c.shape.heads = 8;
  c.shape.seq_len = 256;
  c.device = "meta";
  c.progress = false;
  validate(c);
  Prediction p;
  Plan plan;
  plan_on(c, parse_cluster_spec("8xa100-80"), &p, &plan);
  const std::vector<StageTimeline> stages = stage_timelines(plan, p, /*max_segments=*/100000);
  ASSERT_EQ(stages.size(), 2u);
  for (const StageTimeline& t : stages) {
    SCOPED_TRACE(t.stage);
    const RankStats& stats = p.replay.ranks.at(static_cast<size_t>(t.rank));
    const double step = p.replay.makespan_s, tolerance = 1e-12 * step;
    EXPECT_NEAR(t.compute_s, stats.compute_busy_s, tolerance);
    EXPECT_NEAR(t.exposed_comm_s, stats.exposed_comm_s, tolerance);
    EXPECT_NEAR(t.compute_s + t.exposed_comm_s + t.bubble_s, step, tolerance);
    EXPECT_NEAR(total(t, StepActivity::Compute), t.compute_s, tolerance);
    EXPECT_NEAR(total(t, StepActivity::ExposedComm), t.exposed_comm_s, tolerance);
    EXPECT_GT(t.bubble_s, 0); // a pipeline of 4 micro-batches on 2 stages idles
  }
  EXPECT_EQ(stages[0].stage, 0);
  EXPECT_EQ(stages[1].stage, 1);
}
