// Pipeline schedules checked without a model: every generated schedule passes the dry run
// with the textbook bubble (P-1)/(M+P-1) and the activations in flight that GPipe and 1F1B
// are known for; broken schedules are reported, not run.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "parallel/pipeline/schedule.h"

using namespace meshsim;

namespace {

// Removes the first occurrence of `text` from the list of the rank that runs it.
void remove_action(Schedule& s, const std::string& text) {
  const Action a = parse_action(text);
  auto& list = s.at(static_cast<size_t>(a.stage) % s.size());
  auto it = std::find(list.begin(), list.end(), a);
  ASSERT_NE(it, list.end()) << text;
  list.erase(it);
}

size_t index_of(const Schedule& s, const std::string& text) {
  const Action a = parse_action(text);
  const auto& list = s.at(static_cast<size_t>(a.stage) % s.size());
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

// Interleaved 1F1B (virtual stages): P ranks hold V chunks each, chunk c on rank c % P.

TEST(PipelineSchedule, InterleavedBubbleIsPMinusOneOverMV) {
  // Narayanan et al. (SC'21): the bubble takes (P-1)(t_f+t_b)/V against the ideal M(t_f+t_b),
  // a ratio of (P-1)/(M·V); V = 1 is 1F1B's (P-1)/M. Each chunk costs 1/V of a stage, so the
  // ideal is the same for every V.
  for (double backward : {1.0, 2.0}) {
    for (int P : {2, 4}) {
      for (int M : {P, 2 * P, 4 * P}) {
        for (int V : {1, 2, 4}) {
          const Schedule s = make_schedule("1f1b", P, M, V);
          const DryRun d = dry_run(s, 1.0, backward);
          const std::string what = "P=" + std::to_string(P) + " M=" + std::to_string(M) +
                                   " V=" + std::to_string(V) + " B=" + std::to_string(backward);
          ASSERT_TRUE(d.ok) << what << ": " << d.error; // no deadlock, sends and recvs in order
          EXPECT_EQ(d.virtual_stages, V) << what;
          const double ideal = M * (1.0 + backward);
          EXPECT_NEAR(d.bubble_ratio, double(P - 1) / double(M * V), 1e-12) << what;
          EXPECT_NEAR(d.bubble_ratio, (d.makespan - ideal) / ideal, 1e-12) << what;
          EXPECT_NEAR(d.bubble_fraction, 1.0 - ideal / d.makespan, 1e-12) << what;
          if (V == 1) {
            EXPECT_NEAR(d.bubble_ratio, double(P - 1) / M, 1e-12) << what;
            EXPECT_EQ(s, one_f_one_b_schedule(P, M)) << what;
          }
          // Rank r holds its warm-up forwards and one more, in micro-batch-chunks.
          ASSERT_EQ(d.peak_in_flight.size(), size_t(P)) << what;
          for (int r = 0; r < P; ++r) {
            const int warmup = V == 1 ? P - r - 1 : (P - r - 1) * 2 + (V - 1) * P;
            EXPECT_EQ(d.peak_in_flight[r], std::min(warmup + 1, M * V)) << what << " rank " << r;
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedRanksRunTheirOwnChunksInGroupsOfP) {
  const int P = 2, M = 4, V = 2;
  const Schedule s = interleaved_one_f_one_b_schedule(P, M, V);
  ASSERT_EQ(s.size(), size_t(P));
  for (int r = 0; r < P; ++r) {
    std::vector<Action> forwards;
    for (const Action& a : s[r]) {
      EXPECT_EQ(a.stage % P, r) << a.str();
      EXPECT_EQ(parse_action(a.str()), a) << a.str();
      if (a.kind == ActionKind::Forward)
        forwards.push_back(a);
    }
    // Micro-batches 0 and 1 through the first chunk, then the second, then 2 and 3.
    ASSERT_EQ(forwards.size(), size_t(M * V));
    const int order[][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}};
    for (int k = 0; k < M * V; ++k) {
      EXPECT_EQ(forwards[k].stage, r + order[k][0] * P) << "rank " << r << " forward " << k;
      EXPECT_EQ(forwards[k].micro_batch, order[k][1]) << "rank " << r << " forward " << k;
    }
  }
}

TEST(PipelineSchedule, InterleavedRefusesWhatMegatronRefuses) {
  auto message = [](auto make) {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { make_schedule("1f1b", 4, 6, 2); }),
            "the interleaved schedule runs micro-batches in groups of the 4 stages: 6 "
            "micro-batches is not a multiple of 4");
  EXPECT_EQ(message([] { make_schedule("1f1b", 2, 4, 0); }),
            "a pipeline needs at least 1 virtual stage per rank, got 0");
  EXPECT_EQ(message([] { make_schedule("1f1b", 1, 4, 2); }),
            "virtual stages interleave the chunks of 2 or more stages, got 1 stage");
  EXPECT_EQ(message([] { make_schedule("gpipe", 2, 4, 2); }),
            "virtual stages run with the 1f1b schedule, not gpipe");
  EXPECT_EQ(message([] { make_schedule("interleaved", 2, 4, 2); }),
            "unknown pipeline schedule 'interleaved' (expected naive, gpipe or 1f1b)");
  EXPECT_NO_THROW(make_schedule("1f1b", 4, 6, 1)); // plain 1F1B takes any count
}

TEST(PipelineSchedule, InterleavedMistakesAreReportedByVirtualStage) {
  Schedule s = interleaved_one_f_one_b_schedule(2, 4, 2);
  remove_action(s, "1SEND_B2");
  EXPECT_EQ(dry_run(s).error, "virtual stage 1 never runs 1SEND_B2 (unmatched by its neighbour)");

  s = interleaved_one_f_one_b_schedule(2, 4, 2);
  s[1].push_back({2, ActionKind::Forward, 0});
  EXPECT_EQ(dry_run(s).error, "rank 1 lists 2F0 of another rank");

  s = interleaved_one_f_one_b_schedule(2, 4, 2);
  s[1].push_back({4, ActionKind::Forward, 0});
  EXPECT_EQ(dry_run(s).error, "the schedule's 5 virtual stages are not a multiple of its 2 ranks");
}

TEST(PipelineSchedule, SendsAndRecvsBetweenTwoRanksMustComeInOneOrder) {
  // Rank 0 sends micro-batch 1's activation before micro-batch 0's: the in-process backend
  // would match them by tag, but NCCL and the cost model match by order.
  for (int V : {1, 2}) {
    Schedule s = make_schedule("1f1b", 2, 4, V);
    auto& list = s[0];
    const auto send0 = list.begin() + static_cast<std::ptrdiff_t>(index_of(s, "0SEND_F0"));
    const Action moved = *send0;
    list.erase(send0);
    list.insert(list.begin() + static_cast<std::ptrdiff_t>(index_of(s, "0SEND_F1")) + 1, moved);
    const std::string who = V == 1 ? "stage" : "rank";
    EXPECT_EQ(dry_run(s).error, who + " 1's receive #1 from " + who +
                                    " 0 is 1RECV_F0 but its send #1 there is 0SEND_F1 "
                                    "(messages between two ranks are matched in order)")
        << "V=" << V;
  }
}

TEST(PipelineSchedule, PrintsInterleavedP2M4V2ForTheDocs) {
  const Schedule s = make_schedule("1f1b", 2, 4, 2);
  const DryRun d = dry_run(s);
  std::cout << "interleaved 1f1b (P=2, M=4, V=2): makespan " << d.makespan << ", bubble ratio "
            << d.bubble_ratio << ", bubble fraction " << d.bubble_fraction << "\n"
            << format_schedule(s);
  EXPECT_EQ(format_schedule(s),
            "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1 0F2 "
            "0SEND_F2 2RECV_B0 2B0 2SEND_B0 0F3 0SEND_F3 2RECV_B1 2B1 2SEND_B1 2RECV_F2 2F2 "
            "2SEND_F2 0RECV_B0 0B0 2RECV_F3 2F3 2SEND_F3 0RECV_B1 0B1 2RECV_B2 2B2 2SEND_B2 "
            "2RECV_B3 2B3 2SEND_B3 0RECV_B2 0B2 0RECV_B3 0B3\n"
            "rank 1: 1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 3RECV_F0 3F0 3B0 3SEND_B0 "
            "3RECV_F1 3F1 3B1 3SEND_B1 1RECV_F2 1F2 1SEND_F2 1RECV_B0 1B0 1SEND_B0 1RECV_F3 1F3 "
            "1SEND_F3 1RECV_B1 1B1 1SEND_B1 3RECV_F2 3F2 3B2 3SEND_B2 3RECV_F3 3F3 3B3 3SEND_B3 "
            "1RECV_B2 1B2 1SEND_B2 1RECV_B3 1B3 1SEND_B3\n");
}
