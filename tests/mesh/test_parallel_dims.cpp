// The dp × tp × pp layout: Megatron's rank order and the groups it gives.
#include <gtest/gtest.h>

#include "mesh/parallel_dims.h"

using namespace meshsim;

TEST(ParallelDims, EightGpusAsTwoByTwoByTwo) {
  const auto d = ParallelDims::make(8, 2, 2);
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.tp_group(5).ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(d.dp_group(5).ranks, (std::vector<int>{5, 7}));
  EXPECT_EQ(d.pp_group(5).ranks, (std::vector<int>{1, 5}));
  EXPECT_EQ(d.describe(), "dp=2 × tp=2 × pp=2");
}

TEST(ParallelDims, CoordAndRankAreInverse) {
  const auto d = ParallelDims::make(24, 2, 3);
  EXPECT_EQ(d.dp, 4);
  for (int r = 0; r < 24; ++r) {
    const auto c = d.coord(r);
    EXPECT_EQ(d.rank(c), r);
    EXPECT_LT(c.dp, 4);
    EXPECT_EQ(d.tp_group(r).index_of(r), c.tp);
    EXPECT_EQ(d.dp_group(r).index_of(r), c.dp);
    EXPECT_EQ(d.pp_group(r).index_of(r), c.pp);
  }
}

TEST(ParallelDims, RejectsWorldNotDivisibleByTpTimesPp) {
  try {
    ParallelDims::make(6, 2, 2);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--gpus 6 is not divisible by --tp 2 × --pp 2 = 4");
  }
  EXPECT_THROW(ParallelDims::make(4, 0, 1), std::invalid_argument);
}
