// `meshsim bench comm --model-only`: the modelled all_reduce and all_to_all rows of every GPU of
// 2026 meshsim knows (H100, its 96 GB board, H200, H800, B200 and a GB200 NVL72 rack), and one
// line for a cluster it does not know.
#include <gtest/gtest.h>

#include <algorithm>

#include "cli_harness.h"

namespace meshsim {
namespace {

TEST(CliBenchComm, TheClustersOf2026HaveAllReduceAndAllToAllRows) {
  for (const char* cluster :
       {"2x8xh100", "2x8xh100-96", "2x8xh200", "2x8xh800", "2x8xb200", "2x72xgb200"}) {
    const auto r = testing::run_meshsim_exactly(
        std::string(
            "bench comm --model-only --min-bytes 67108864 --max-bytes 67108864 --cluster ") +
        cluster);
    ASSERT_EQ(r.code, 0) << cluster << ": " << r.output;
    for (const char* section : {"# all_reduce", "# all_to_all", " MiB "})
      EXPECT_NE(r.output.find(section), std::string::npos) << cluster << ": " << r.output;
  }
  const auto bad = testing::run_meshsim_exactly("bench comm --model-only --cluster 2x8xh900");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_EQ(std::count(bad.output.begin(), bad.output.end(), '\n'), 1) << bad.output;
}

} // namespace
} // namespace meshsim
