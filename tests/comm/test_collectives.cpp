// Collectives with exactly known results (nccl-tests style: rank r contributes r+1), on the
// whole world and on partial groups, plus timeouts and mismatches.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

using namespace meshsim;

namespace {

MeshOptions options(int world, int timeout_ms = 20000) {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = int64_t{1} << 30;
  o.comm_timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

// Sizes that do not split evenly, and one large enough to take many blocks.
const std::vector<int64_t> kSizes{1, 7, 1000, 100003};

} // namespace

TEST(CommCollectives, AllReduceSumAvgMaxExact) {
  for (int world : {1, 2, 3, 4, 8}) {
    DeviceMesh mesh(options(world));
    run_ranks(mesh, [&](RankContext& ctx) {
      for (int64_t n : kSizes) {
        const float mine = static_cast<float>(ctx.rank + 1);
        auto t = torch::full({n}, mine);
        ctx.comm.all_reduce(t, ReduceOp::Sum);
        const float sum = world * (world + 1) / 2.0f;
        ASSERT_TRUE(torch::equal(t, torch::full({n}, sum))) << "world " << world << " n " << n;
        t.fill_(mine);
        ctx.comm.all_reduce(t, ReduceOp::Avg);
        ASSERT_TRUE(torch::equal(t, torch::full({n}, sum / world)));
        // Element i of rank r holds r*n + i, so the max is (world-1)*n + i.
        auto m = torch::arange(n, torch::kFloat64) + static_cast<double>(ctx.rank * n);
        ctx.comm.all_reduce(m, ReduceOp::Max);
        ASSERT_TRUE(torch::equal(m, torch::arange(n, torch::kFloat64) + double((world - 1) * n)));
        auto counts = torch::full({n}, int64_t{ctx.rank + 1}, torch::kInt64);
        ctx.comm.all_reduce(counts, ReduceOp::Sum);
        ASSERT_EQ(counts[0].item<int64_t>(), world * (world + 1) / 2);
      }
    });
  }
}

TEST(CommCollectives, BroadcastAllGatherReduceScatterReduceExact) {
  const int world = 4;
  DeviceMesh mesh(options(world));
  run_ranks(mesh, [&](RankContext& ctx) {
    for (int64_t n : kSizes) {
      for (int root = 0; root < world; ++root) {
        auto t = torch::arange(n, torch::kFloat32) * float(ctx.rank + 1);
        ctx.comm.broadcast(t, root);
        ASSERT_TRUE(torch::equal(t, torch::arange(n, torch::kFloat32) * float(root + 1)));
      }
      auto gathered = ctx.comm.all_gather(torch::full({n}, float(ctx.rank + 1)), Group::world(world));
      ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{world, n}));
      for (int r = 0; r < world; ++r)
        ASSERT_TRUE(torch::equal(gathered[r], torch::full({n}, float(r + 1))));
      // Rank r holds (r+1) * [0, 1, ..., world*n); chunk i of the sum is 10 * its slice.
      auto in = torch::arange(world * n, torch::kFloat32) * float(ctx.rank + 1);
      auto chunk = ctx.comm.reduce_scatter(in, ReduceOp::Sum, Group::world(world));
      auto expect = torch::arange(ctx.rank * n, (ctx.rank + 1) * n, torch::kFloat32) * 10.0f;
      ASSERT_TRUE(torch::equal(chunk, expect));
      auto r = torch::full({n}, float(ctx.rank + 1));
      ctx.comm.reduce(r, 2, ReduceOp::Sum, Group::world(world));
      ASSERT_EQ(r[0].item<float>(), ctx.rank == 2 ? 10.0f : float(ctx.rank + 1));
    }
  });
}

TEST(CommCollectives, PartialGroupsRunIndependently) {
  // Ranks {0,2} and {1,3} reduce at the same time; {1,2,3} then reduces in a different order.
  DeviceMesh mesh(options(4));
  run_ranks(mesh, [&](RankContext& ctx) {
    Group even{{0, 2}}, odd{{1, 3}};
    Group& mine = ctx.rank % 2 == 0 ? even : odd;
    auto t = torch::full({1000}, float(ctx.rank + 1));
    ctx.comm.all_reduce(t, ReduceOp::Sum, mine);
    ASSERT_EQ(t[0].item<float>(), ctx.rank % 2 == 0 ? 1.0f + 3.0f : 2.0f + 4.0f);
    if (ctx.rank > 0) {
      Group tail{{3, 1, 2}};
      auto u = torch::full({5}, float(ctx.rank + 1));
      ctx.comm.all_reduce(u, ReduceOp::Sum, tail);
      ASSERT_EQ(u[4].item<float>(), 2.0f + 3.0f + 4.0f);
      auto g = ctx.comm.all_gather(torch::full({2}, float(ctx.rank)), tail);
      ASSERT_EQ(g[0][0].item<float>(), 3.0f);  // group order, not rank order
      ctx.comm.barrier(tail);
    }
  });
}

TEST(CommCollectives, SendRecvPairsAndTags) {
  DeviceMesh mesh(options(3));
  run_ranks(mesh, [&](RankContext& ctx) {
    const int next = (ctx.rank + 1) % 3, prev = (ctx.rank + 2) % 3;
    ctx.comm.send(torch::full({4}, float(ctx.rank)), next, 7);
    ctx.comm.send(torch::full({2}, float(10 + ctx.rank)), next, 8);
    auto b = ctx.comm.recv(prev, 8);  // tags are matched independently
    auto a = ctx.comm.recv(prev, 7);
    ASSERT_EQ(a.numel(), 4);
    ASSERT_EQ(a[0].item<float>(), float(prev));
    ASSERT_EQ(b[1].item<float>(), float(10 + prev));
  });
}

TEST(CommCollectives, EveryCallIsRecorded) {
  DeviceMesh mesh(options(2));
  auto recorders = run_ranks(mesh, [&](RankContext& ctx) {
    auto t = torch::zeros({256});
    ctx.comm.all_reduce(t, ReduceOp::Sum);
    ctx.comm.barrier();
  });
  ASSERT_EQ(recorders[1].collectives.size(), 2u);
  EXPECT_EQ(recorders[1].collectives[0].op, "all_reduce");
  EXPECT_EQ(recorders[1].collectives[0].bytes, 256 * 4);
  EXPECT_EQ(recorders[1].collectives[0].group, (std::vector<int>{0, 1}));
  EXPECT_EQ(recorders[1].collectives[1].op, "barrier");
  EXPECT_EQ(recorders[1].collectives[1].seq, 1);
}

TEST(CommFailures, SkippedCollectiveTimesOutNamingMissingRank) {
  DeviceMesh mesh(options(4, /*timeout_ms=*/500));
  const auto start = std::chrono::steady_clock::now();
  try {
    run_ranks(mesh, [&](RankContext& ctx) {
      auto t = torch::ones({16});
      ctx.comm.all_reduce(t, ReduceOp::Sum);  // #0: everyone
      if (ctx.rank == 2) return;               // rank 2 skips #1
      ctx.comm.all_reduce(t, ReduceOp::Sum);
    });
    FAIL() << "expected a timeout";
  } catch (const CollectiveTimeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_reduce #1"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 2 never arrived"), std::string::npos) << what;
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited, 5.0);  // the timeout, not a hang
}

TEST(CommFailures, RecvWithoutSendTimesOut) {
  DeviceMesh mesh(options(2, 300));
  EXPECT_THROW(run_ranks(mesh, [&](RankContext& ctx) {
                 if (ctx.rank == 0) ctx.comm.recv(1, 0);
               }),
               CollectiveTimeout);
}

TEST(CommFailures, MismatchedCollectivesAreNamed) {
  DeviceMesh mesh(options(2));
  try {
    run_ranks(mesh, [&](RankContext& ctx) {
      auto t = torch::ones({ctx.rank == 0 ? 4 : 5});
      ctx.comm.all_reduce(t, ReduceOp::Sum);
    });
    FAIL() << "expected a mismatch";
  } catch (const CollectiveMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("collective #0"), std::string::npos);
  }
}

TEST(CommFailures, FailingRankReleasesWaitersAtOnce) {
  DeviceMesh mesh(options(4, /*timeout_ms=*/60000));
  const auto start = std::chrono::steady_clock::now();
  try {
    run_ranks(mesh, [&](RankContext& ctx) {
      if (ctx.rank == 3) throw std::runtime_error("boom on 3");
      auto t = torch::ones({16});
      ctx.comm.all_reduce(t, ReduceOp::Sum);
    });
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "boom on 3");  // the cause, not "aborted"
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}
