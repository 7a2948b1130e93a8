// The named parallel dimensions: Megatron's rank order for dp × tp × pp, and every derived
// group (cp, HSDP, ep and edp) against lists computed by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

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

namespace parallel_dims_test {

std::vector<int> ranks_of(const ParallelDims& d, int rank, const char* name) {
  return d.group(rank, name).ranks;
}

ParallelDims sized(int world, int tp, int pp, int cp, int ep, int dp_shard = 0) {
  ParallelSizes s;
  s.world = world;
  s.tp = tp;
  s.pp = pp;
  s.cp = cp;
  s.ep = ep;
  s.dp_shard = dp_shard;
  return ParallelDims::make(s);
}

} // namespace parallel_dims_test

using parallel_dims_test::ranks_of;
using parallel_dims_test::sized;

// cp = ep = 1: every named group is today's (Megatron's order), for every layout the CLI can
// ask of up to 24 GPUs; the new names are the old groups or one rank.
TEST(ParallelDims, CpAndEpOfOneKeepTodaysGroups) {
  for (int world = 1; world <= 24; ++world)
    for (int tp = 1; tp <= world; ++tp)
      for (int pp = 1; pp * tp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        const auto d = ParallelDims::make(world, tp, pp);
        const int dp = world / (tp * pp);
        ASSERT_EQ(d.dp, dp);
        for (int r = 0; r < world; ++r) {
          const int t = r % tp, i = (r / tp) % dp, s = r / (tp * dp);
          std::vector<int> tp_ranks, dp_ranks, pp_ranks;
          for (int k = 0; k < tp; ++k) tp_ranks.push_back(s * dp * tp + i * tp + k);
          for (int k = 0; k < dp; ++k) dp_ranks.push_back(s * dp * tp + k * tp + t);
          for (int k = 0; k < pp; ++k) pp_ranks.push_back(k * dp * tp + i * tp + t);
          EXPECT_EQ(d.tp_group(r).ranks, tp_ranks);
          EXPECT_EQ(d.dp_group(r).ranks, dp_ranks);
          EXPECT_EQ(d.pp_group(r).ranks, pp_ranks);
          for (const char* name : {"dp_shard", "dp_shard_cp", "dp_cp", "edp"})
            EXPECT_EQ(ranks_of(d, r, name), dp_ranks) << name;
          for (const char* name : {"cp", "ep", "dp_replicate"})
            EXPECT_EQ(ranks_of(d, r, name), std::vector<int>{r}) << name;
          EXPECT_EQ(d.rank({i, t, s}), r);
        }
      }
}

// 16 GPUs as pp 2 × dp 2 × cp 2 × tp 2, ep 2: rank = ((pp·2 + dp)·2 + cp)·2 + tp. Rank 5 is
// pp 0, dp 1, cp 0, tp 1.
TEST(ParallelDims, SixteenGpusWithCpTwoAndEpTwo) {
  const auto d = sized(16, 2, 2, 2, 2);
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.dp_shard, 2);
  EXPECT_EQ(d.dp_replicate, 1);
  const auto c = d.coord(5);
  EXPECT_EQ((std::vector<int>{c.pp, c.dp, c.cp, c.tp}), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(ranks_of(d, 5, "tp"), (std::vector<int>{4, 5}));
  EXPECT_EQ(ranks_of(d, 5, "cp"), (std::vector<int>{5, 7}));
  EXPECT_EQ(ranks_of(d, 5, "pp"), (std::vector<int>{5, 13}));
  EXPECT_EQ(ranks_of(d, 5, "dp"), (std::vector<int>{1, 5}));
  EXPECT_EQ(ranks_of(d, 5, "dp_shard"), (std::vector<int>{1, 5}));
  EXPECT_EQ(ranks_of(d, 5, "dp_replicate"), (std::vector<int>{5}));
  EXPECT_EQ(ranks_of(d, 5, "dp_shard_cp"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(ranks_of(d, 5, "dp_cp"), (std::vector<int>{1, 3, 5, 7}));
  // ep borrows the cp dimension here: groups of 2 consecutive among {1, 3, 5, 7}
  EXPECT_EQ(ranks_of(d, 5, "ep"), (std::vector<int>{5, 7}));
  EXPECT_EQ(ranks_of(d, 5, "edp"), (std::vector<int>{1, 5}));
  EXPECT_EQ(ranks_of(d, 10, "dp_cp"), (std::vector<int>{8, 10, 12, 14}));
  EXPECT_EQ(ranks_of(d, 10, "ep"), (std::vector<int>{8, 10}));
  EXPECT_EQ(ranks_of(d, 10, "edp"), (std::vector<int>{10, 14}));
  EXPECT_EQ(d.size("edp"), 2);
  EXPECT_EQ(d.describe(), "dp=2 × cp=2 × tp=2 × pp=2, ep=2");
}

// 8 GPUs as dp 4 × cp 2, ep 4 (ep takes cp and half of dp): rank = dp·2 + cp.
TEST(ParallelDims, EightGpusWithCpTwoAndEpFour) {
  const auto d = sized(8, 1, 1, 2, 4);
  EXPECT_EQ(d.dp, 4);
  EXPECT_EQ(ranks_of(d, 5, "cp"), (std::vector<int>{4, 5}));
  EXPECT_EQ(ranks_of(d, 5, "dp"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(ranks_of(d, 5, "dp_cp"), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ranks_of(d, 5, "ep"), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(ranks_of(d, 5, "edp"), (std::vector<int>{1, 5}));
  EXPECT_EQ(ranks_of(d, 2, "ep"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ranks_of(d, 2, "edp"), (std::vector<int>{2, 6}));
}

// 16 GPUs as dp 8 × tp 2, ep 4: Megatron's expert groups, ep within a tp rank's dp ranks.
TEST(ParallelDims, EpWithTensorParallelAsMegatron) {
  const auto d = sized(16, 2, 1, 1, 4);
  EXPECT_EQ(ranks_of(d, 5, "ep"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(ranks_of(d, 5, "edp"), (std::vector<int>{5, 13}));
  EXPECT_EQ(ranks_of(d, 8, "ep"), (std::vector<int>{8, 10, 12, 14}));
  EXPECT_EQ(ranks_of(d, 8, "edp"), (std::vector<int>{0, 8}));
}

// HSDP: 8 GPUs, dp 8 = 4 replicas × 2 shards, ep 2: rank = replica·2 + shard.
TEST(ParallelDims, HsdpShardsWithinAndReplicatesAcross) {
  const auto d = sized(8, 1, 1, 1, 2, /*dp_shard=*/2);
  EXPECT_EQ(d.dp_replicate, 4);
  EXPECT_EQ(ranks_of(d, 5, "dp_shard"), (std::vector<int>{4, 5}));
  EXPECT_EQ(ranks_of(d, 5, "dp_replicate"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(ranks_of(d, 5, "dp"), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ranks_of(d, 5, "ep"), (std::vector<int>{4, 5}));
  EXPECT_EQ(ranks_of(d, 5, "edp"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(d.describe(), "dp=8 (replicate 4 × shard 2) × tp=1 × pp=1, ep=2");
}

// Whatever the sizes: every group holds its rank, has size(name) members in rank order, and
// the groups of one name partition the world; coord() and rank() are inverse.
TEST(ParallelDims, EveryGroupPartitionsTheWorld) {
  for (const auto& d : {sized(16, 2, 2, 2, 2), sized(24, 1, 2, 3, 6), sized(32, 2, 1, 2, 4, 4),
                        sized(8, 1, 1, 1, 2, 2)}) {
    for (const auto& name : ParallelDims::group_names()) {
      for (int r = 0; r < d.world; ++r) {
        const Group g = d.group(r, name);
        ASSERT_EQ(g.size(), d.size(name)) << name;
        EXPECT_GE(g.index_of(r), 0) << name;
        EXPECT_TRUE(std::is_sorted(g.ranks.begin(), g.ranks.end())) << name;
        for (int m : g.ranks) EXPECT_EQ(d.group(m, name).ranks, g.ranks) << name;
      }
    }
    for (int r = 0; r < d.world; ++r) EXPECT_EQ(d.rank(d.coord(r)), r);
    EXPECT_EQ(d.size("ep") * d.size("edp"), d.size("dp_cp"));
  }
}

TEST(ParallelDims, RejectsSizesInOneLine) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { sized(8, 2, 1, 3, 1); }),
            "--gpus 8 is not divisible by --tp 2 × --pp 1 × --cp 3 = 6");
  EXPECT_EQ(message([] { sized(8, 1, 1, 0, 1); }), "--cp must be at least 1, got 0");
  EXPECT_EQ(message([] { sized(8, 1, 1, 1, 0); }), "--ep must be at least 1, got 0");
  EXPECT_EQ(message([] { sized(8, 1, 1, 1, 1, 3); }),
            "--dp-shard 3 does not divide the 8 data-parallel ranks");
  EXPECT_EQ(message([] { sized(8, 1, 1, 2, 3); }),
            "--ep 3 does not divide dp_shard 4 × --cp 2 = 8");
  EXPECT_EQ(message([] { sized(8, 1, 1, 1, 4, 2); }),
            "--ep 4 does not divide dp_shard 2 × --cp 1 = 2");
  EXPECT_EQ(message([] { ParallelDims::make(8, 2, 2).group(0, "dpcp"); }),
            "unknown parallel group 'dpcp' (one of tp, cp, pp, dp_replicate, dp_shard, dp, "
            "dp_shard_cp, dp_cp, ep, edp)");
}

// Megatron's embedding group, by hand: 8 GPUs as dp 2 × tp 2 × pp 2 (stage 0 ranks 0-3,
// stage 1 ranks 4-7): each first-stage rank pairs with the last-stage rank of its dp and tp
// index. With pp 4 the middle stages hold neither copy; with one stage a rank is alone.
TEST(ParallelDims, EmbeddingGroupPairsTheFirstAndLastStage) {
  const ParallelDims d = ParallelDims::make(8, 2, 2);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(d.embedding_group(r).ranks, (std::vector<int>{r, r + 4}));
    EXPECT_EQ(d.embedding_group(r + 4).ranks, (std::vector<int>{r, r + 4}));
  }
  const ParallelDims four = ParallelDims::make(8, 1, 4);  // dp 2: stages of ranks {0,1} ... {6,7}
  EXPECT_EQ(four.embedding_group(1).ranks, (std::vector<int>{1, 7}));
  EXPECT_EQ(four.embedding_group(6).ranks, (std::vector<int>{0, 6}));
  EXPECT_TRUE(four.embedding_group(2).ranks.empty());
  EXPECT_TRUE(four.embedding_group(5).ranks.empty());
  EXPECT_EQ(ParallelDims::make(4, 2, 1).embedding_group(3).ranks, (std::vector<int>{3}));
}
