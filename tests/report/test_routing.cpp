// routing.csv and summary.json's "routing" (report/routing.h) from hand-built records: every
// number is the records' own, added up by hand here.
#include <gtest/gtest.h>

#include "report/routing.h"

using namespace meshsim;

namespace {

// Two ranks of one ep group, 4 experts (rank 0 holds 0-1, rank 1 holds 2-3), layer 1, two
// steps. Step 1: rank 0 sends 3,1,0,4 and rank 1 sends 1,1,2,4; step 2: 2,2,2,2 and 5,1,1,1.
std::vector<RoutingRecord> hand_built() {
  return {
      {2, 1, 1, 2, {5, 1, 1, 1}, {3, 3}}, // out of order: the csv sorts them
      {1, 0, 1, 0, {3, 1, 0, 4}, {4, 2}},
      {1, 1, 1, 2, {1, 1, 2, 4}, {2, 8}},
      {2, 0, 1, 0, {2, 2, 2, 2}, {7, 3}},
  };
}

} // namespace

TEST(Routing, CsvHasEveryExpertOfEveryRecordInOrder) {
  const std::string csv = routing_csv(hand_built());
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "step,rank,layer,expert,routed,ran");
  EXPECT_NE(csv.find("\n1,0,1,0,3,4\n1,0,1,1,1,2\n1,0,1,2,0,\n1,0,1,3,4,\n1,1,1,0,1,\n"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find("\n2,1,1,2,1,3\n2,1,1,3,1,3\n"), std::string::npos) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 4 * 4);
}

TEST(Routing, SummaryAddsTheRecordsUp) {
  const nlohmann::json s = routing_summary(hand_built());
  EXPECT_EQ(s["experts"], 4);
  EXPECT_EQ(s["layers"], nlohmann::json({1}));
  EXPECT_EQ(s["steps"], nlohmann::json({1, 2}));
  EXPECT_EQ(s["tokens_per_expert"]["1"], nlohmann::json({11, 5, 5, 11}));
  // Step 1: 4,2,2,8 of 16, the busiest 8 over a mean of 4; step 2: 7,3,3,3, 7 over 4.
  EXPECT_EQ(s["imbalance"]["1"], nlohmann::json({2.0, 1.75}));
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_EQ(s["ranks"][0]["rows_ran"], 16);
  EXPECT_EQ(s["ranks"][0]["most_rows_in_a_step"], 10);
  EXPECT_EQ(s["ranks"][0]["experts"], nlohmann::json({0, 1}));
  EXPECT_EQ(s["ranks"][1]["rows_ran"], 16);
  EXPECT_EQ(s["ranks"][1]["most_rows_in_a_step"], 10);
  EXPECT_EQ(s["ranks"][1]["experts"], nlohmann::json({2, 3}));
  EXPECT_TRUE(routing_summary({}).is_null());
}
