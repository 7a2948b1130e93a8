// Pipeline schedules checked without a model: every generated schedule passes the dry run
// with the textbook bubble (P-1)/(M+P-1) and the activations in flight that GPipe and 1F1B
// are known for; broken schedules are reported, not run.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "parallel/schedule.h"

using namespace meshsim;

namespace {

// Removes the first occurrence of `text` from its stage's list.
void remove_action(Schedule& s, const std::string& text) {
  const Action a = parse_action(text);
  auto& list = s.at(a.stage);
  auto it = std::find(list.begin(), list.end(), a);
  ASSERT_NE(it, list.end()) << text;
  list.erase(it);
}

size_t index_of(const Schedule& s, const std::string& text) {
  const Action a = parse_action(text);
  const auto& list = s.at(a.stage);
  return static_cast<size_t>(std::find(list.begin(), list.end(), a) - list.begin());
}

} // namespace

TEST(PipelineSchedule, GeneratedSchedulesHaveTheTextbookBubbleAndMemory) {
  for (int P : {2, 4}) {
    for (int M : {1, 4, 8}) {
      for (const auto& name : schedule_names()) {
        const DryRun d = dry_run(make_schedule(name, P, M));
        const std::string what = name + " P=" + std::to_string(P) + " M=" + std::to_string(M);
        ASSERT_TRUE(d.ok) << what << ": " << d.error;
        const int m = name == "naive" ? 1 : M;
        EXPECT_NEAR(d.bubble_fraction, double(P - 1) / double(m + P - 1), 1e-12) << what;
        EXPECT_DOUBLE_EQ(d.makespan, 2.0 * (m + P - 1)) << what;
        ASSERT_EQ(d.peak_in_flight.size(), size_t(P)) << what;
        for (int s = 0; s < P; ++s) {
          const int expected = name == "1f1b" ? std::min(P - s, m) : m;
          EXPECT_EQ(d.peak_in_flight[s], expected) << what << " stage " << s;
        }
      }
    }
  }
}

TEST(PipelineSchedule, NaiveIsOneMicroBatchWithBubbleOneMinusOneOverP) {
  for (int P : {2, 4}) {
    const DryRun d = dry_run(make_schedule("naive", P, 8));
    ASSERT_TRUE(d.ok) << d.error;
    EXPECT_NEAR(d.bubble_fraction, double(P - 1) / P, 1e-12);
    for (const auto& list : naive_schedule(P))
      for (const auto& a : list)
        EXPECT_EQ(a.micro_batch, 0);
  }
}

TEST(PipelineSchedule, UnequalCostsStillPassAndBackwardDominates) {
  // With B = 2F (the usual ratio) GPipe's makespan is (M+P-1)(F+B): bubble unchanged.
  const DryRun d = dry_run(gpipe_schedule(4, 8), 1.0, 2.0);
  ASSERT_TRUE(d.ok) << d.error;
  EXPECT_DOUBLE_EQ(d.makespan, 11 * 3.0);
  EXPECT_NEAR(d.bubble_fraction, 3.0 / 11.0, 1e-12);
}

TEST(PipelineSchedule, ActionTextRoundTrips) {
  for (int P : {2, 4})
    for (const auto& name : schedule_names())
      for (const auto& list : make_schedule(name, P, 8))
        for (const auto& a : list)
          EXPECT_EQ(parse_action(a.str()), a) << a.str();
  EXPECT_EQ(Action({2, ActionKind::Forward, 0}).str(), "2F0");
  EXPECT_EQ(Action({2, ActionKind::Backward, 0}).str(), "2B0");
  EXPECT_EQ(Action({2, ActionKind::SendActivation, 0}).str(), "2SEND_F0");
  EXPECT_EQ(Action({2, ActionKind::RecvActivation, 0}).str(), "2RECV_F0");
  EXPECT_EQ(Action({2, ActionKind::SendGrad, 0}).str(), "2SEND_B0");
  EXPECT_EQ(Action({12, ActionKind::RecvGrad, 31}).str(), "12RECV_B31");
  const Action a = parse_action("3SEND_B17");
  EXPECT_EQ(a.stage, 3);
  EXPECT_EQ(a.kind, ActionKind::SendGrad);
  EXPECT_EQ(a.micro_batch, 17);
  for (const char* bad :
       {"", "F0", "2F", "2X0", "2SEND0", "2F0x", "-1F0", "2f0", "2F-1", "2SEND_F"})
    EXPECT_THROW(parse_action(bad), std::invalid_argument) << "'" << bad << "'";
}

TEST(PipelineSchedule, MakeScheduleRejectsBadNamesAndShapes) {
  EXPECT_THROW(make_schedule("interleaved", 2, 4), std::invalid_argument);
  EXPECT_THROW(make_schedule("gpipe", 0, 4), std::invalid_argument);
  EXPECT_THROW(make_schedule("1f1b", 2, 0), std::invalid_argument);
  EXPECT_EQ(make_schedule("1f1b", 4, 8).size(), 4u);
}

TEST(PipelineSchedule, RecvBeforeTheNeighboursSendIsADeadlock) {
  // Stage 0 waits for micro-batch 0's gradient before sending micro-batch 0's activation:
  // stage 1 can never produce that gradient.
  Schedule s = one_f_one_b_schedule(2, 4);
  std::swap(s[0][index_of(s, "0SEND_F0")], s[0][index_of(s, "0RECV_B0")]);
  const DryRun d = dry_run(s);
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.error, "deadlock: stage 0 waits at 0RECV_B0, stage 1 waits at 1RECV_F0");

  // Deeper: in a 4-stage GPipe, stage 2 waits for gradient 0 before sending activation 3.
  Schedule g = gpipe_schedule(4, 4);
  std::swap(g[2][index_of(g, "2SEND_F3")], g[2][index_of(g, "2RECV_B0")]);
  const DryRun dg = dry_run(g);
  EXPECT_FALSE(dg.ok);
  EXPECT_EQ(dg.error, "deadlock: stage 0 waits at 0RECV_B0, stage 1 waits at 1RECV_B0, "
                      "stage 2 waits at 2RECV_B0, stage 3 waits at 3RECV_F3");
}

TEST(PipelineSchedule, MissingOrMisplacedActionsAreReported) {
  Schedule s = gpipe_schedule(2, 4);
  remove_action(s, "1B2");
  DryRun d = dry_run(s);
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.error, "stage 1 never runs 1B2 (the backward of micro-batch 2)");

  s = one_f_one_b_schedule(4, 4);
  remove_action(s, "2SEND_F1");
  d = dry_run(s);
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.error, "stage 2 never runs 2SEND_F1 (unmatched by its neighbour)");

  s = gpipe_schedule(2, 2);
  std::swap(s[0][index_of(s, "0F1")], s[0][index_of(s, "0B1")]); // backward before forward
  d = dry_run(s);
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.error, "stage 0 runs 0B1 before 0F1");

  s = gpipe_schedule(2, 2);
  s[0].push_back({0, ActionKind::Forward, 1});
  EXPECT_EQ(dry_run(s).error, "stage 0 runs 0F1 twice");

  s = gpipe_schedule(2, 2);
  s[0].push_back({0, ActionKind::RecvActivation, 0});
  EXPECT_EQ(dry_run(s).error, "stage 0 has no previous stage but runs 0RECV_F0");

  s = gpipe_schedule(2, 2);
  s[1][0].stage = 0;
  EXPECT_EQ(dry_run(s).error, "stage 1 lists 0RECV_F0 of another stage");

  EXPECT_FALSE(dry_run(Schedule{}).ok);
}

TEST(PipelineSchedule, PrintsP2M4ForTheDocs) {
  for (const auto& name : schedule_names()) {
    const Schedule s = make_schedule(name, 2, 4);
    const DryRun d = dry_run(s);
    std::cout << name << " (P=2, M=4): makespan " << d.makespan << ", bubble " << d.bubble_fraction
              << "\n"
              << format_schedule(s);
  }
  EXPECT_EQ(format_schedule(naive_schedule(2)),
            "stage 0: 0F0 0SEND_F0 0RECV_B0 0B0\nstage 1: 1RECV_F0 1F0 1B0 1SEND_B0\n");
}
