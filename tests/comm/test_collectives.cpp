// Collectives with exactly known results (nccl-tests style: rank r contributes r+1), on the
// whole world and on partial groups, plus timeouts and mismatches.
//
// all_to_all with uneven splits and isend/irecv (namespace all_to_all_test below): member i of
// a group sends member j rows(i, j) rows of two columns, row k holding 1000 i + 100 j + 10 k +
// column, so every received row says who sent it and where it belongs. The same program runs
// on the in-process backend, on the plan backend (records only) and over c10d/Gloo in real
// processes (this test binary started again, once per rank, on a disabled worker test).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "comm/c10d_backend.h"
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

// all_gather_async: started, the rank computes, then waits; into a separate output and in place
// (the input a view of the member's own slot of the output, as ZeRO's distributed optimizer
// gathers its parameters), and over a partial group. Exact: every slot is the member's values.
TEST(CommCollectives, AllGatherAsyncExactAlsoInPlace) {
  const int world = 4;
  DeviceMesh mesh(options(world));
  run_ranks(mesh, [&](RankContext& ctx) {
    for (int64_t n : kSizes) {
      const Group all = Group::world(world);
      torch::Tensor out = torch::empty({world, n}, torch::kFloat64);
      auto work = ctx.comm.all_gather_async(
          torch::full({n}, double(ctx.rank + 1), torch::kFloat64), out, all);
      const torch::Tensor busy = torch::ones({8, 8}).matmul(torch::ones({8, 8})); // meanwhile
      work->wait();
      for (int r = 0; r < world; ++r)
        ASSERT_TRUE(torch::equal(out[r], torch::full({n}, double(r + 1), torch::kFloat64))) << n;
      torch::Tensor flat = torch::zeros({world * n}, torch::kFloat64);
      flat.narrow(0, ctx.rank * n, n).fill_(double(10 * ctx.rank + 3));
      ctx.comm.all_gather_async(flat.narrow(0, ctx.rank * n, n), flat.view({world, n}), all)->wait();
      for (int r = 0; r < world; ++r)
        ASSERT_TRUE(torch::equal(flat.narrow(0, r * n, n),
                                 torch::full({n}, double(10 * r + 3), torch::kFloat64)));
      const Group pair{{ctx.rank % 2, ctx.rank % 2 + 2}};
      torch::Tensor two = torch::empty({2, n}, torch::kFloat32);
      ctx.comm.all_gather_async(torch::full({n}, float(ctx.rank)), two, pair)->wait();
      ASSERT_TRUE(torch::equal(two[0], torch::full({n}, float(ctx.rank % 2))));
      ASSERT_TRUE(torch::equal(two[1], torch::full({n}, float(ctx.rank % 2 + 2))));
      // A wrong size or dtype is refused before anything is sent.
      EXPECT_THROW(ctx.comm.all_gather_async(torch::ones({n}), torch::empty({world, n + 1}), all),
                   std::invalid_argument);
      EXPECT_THROW(ctx.comm.all_gather_async(torch::ones({n}),
                                             torch::empty({world, n}, torch::kFloat64), all),
                   std::invalid_argument);
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

namespace meshsim::all_to_all_test {

// Zero for some pairs (a member may send a peer, or itself, nothing).
int64_t rows(int i, int j) { return (3 * i + 2 * j + 1) % 4; }

// The rows member i sends member j.
torch::Tensor chunk(int i, int j) {
  auto k = torch::arange(rows(i, j), torch::kFloat32).unsqueeze(1) * 10;
  auto c = torch::arange(2, torch::kFloat32).unsqueeze(0);
  return (k + c + float(1000 * i + 100 * j)).contiguous();
}

void require(bool ok, const std::string& what) {
  if (!ok)
    throw std::runtime_error(what);
}

// The groups of sizes 2, 3 and 4 in a world of 4, in an order that is not the ranks'.
const std::vector<Group> kGroups{Group{{2, 0}}, Group{{1, 3, 0}}, Group{{3, 1, 2, 0}}};

// Every exchange a rank of a 4-rank world takes part in, checked exactly; throws on a wrong
// value. The same program for every backend.
void exchange_and_check(Communicator& comm) {
  const int rank = comm.rank();
  for (const Group& g : kGroups) {
    const int me = g.index_of(rank);
    if (me < 0)
      continue;
    const int n = g.size();
    std::vector<torch::Tensor> mine, expected;
    std::vector<int64_t> in_splits, out_splits;
    for (int j = 0; j < n; ++j) {
      mine.push_back(chunk(me, j));
      expected.push_back(chunk(j, me));
      in_splits.push_back(rows(me, j));
      out_splits.push_back(rows(j, me));
    }
    const torch::Tensor out = comm.all_to_all(torch::cat(mine), out_splits, in_splits, g);
    require(torch::equal(out, torch::cat(expected)),
            fmt::format("all_to_all on [{}], rank {}: wrong rows", g.key(), rank));
    const CollectiveRecord& rec = comm.records().back();
    require(rec.op == "all_to_all" && rec.group == g.ranks, "all_to_all not recorded");
    for (int j = 0; j < n; ++j)
      require(rec.peer_bytes.at(j) == rows(me, j) * 2 * 4,
              fmt::format("all_to_all on [{}], rank {}: peer_bytes[{}] is {}", g.key(), rank, j,
                          rec.peer_bytes.at(j)));
  }
  // Equal splits (empty sizes) over the world: member r gets rows 3r..3r+2 of everyone's.
  const Group world = Group::world(4);
  auto in = torch::arange(12, torch::kFloat64) + 100.0 * rank;
  auto out = comm.all_to_all(in, {}, {}, world);
  std::vector<torch::Tensor> want;
  for (int j = 0; j < 4; ++j)
    want.push_back(torch::arange(3 * rank, 3 * rank + 3, torch::kFloat64) + 100.0 * j);
  require(torch::equal(out, torch::cat(want)), fmt::format("equal splits, rank {}", rank));
  // A group of one: a copy.
  auto alone = comm.all_to_all(in, {}, {}, Group{{rank}});
  require(torch::equal(alone, in) && !alone.is_same(in), "a group of one returns a copy");
  // Messages around the ring, both ends asynchronous.
  const int next = (rank + 1) % 4, prev = (rank + 3) % 4;
  auto sent = comm.isend(torch::full({5}, float(rank + 1)), next, 3);
  auto got = torch::zeros({5});
  auto receiving = comm.irecv(got, prev, 3);
  receiving->wait();
  sent->wait();
  require(torch::equal(got, torch::full({5}, float(prev + 1))),
          fmt::format("irecv on rank {}: wrong message", rank));
  comm.barrier(world);
}

// A TCP port nobody listens on now (the kernel's choice; free again once closed).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

MeshOptions options(int world, const std::string& device = "cpu") {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = int64_t{1} << 30;
  o.comm_timeout = std::chrono::milliseconds(20000);
  o.device = device;
  return o;
}

TEST(CommAllToAll, UnevenSplitsExactAtGroupSizesTwoThreeFour) {
  DeviceMesh mesh(options(4));
  run_ranks(mesh, [&](RankContext& ctx) { exchange_and_check(ctx.comm); });
}

TEST(CommAllToAll, MismatchedSplitsAreRefused) {
  DeviceMesh mesh(options(2));
  const Group world = Group::world(2);
  run_ranks(mesh, [&](RankContext& ctx) {
    auto t = torch::ones({5, 2});
    EXPECT_THROW(ctx.comm.all_to_all(t, {}, {2, 2}, world), std::invalid_argument); // 4 of 5
    EXPECT_THROW(ctx.comm.all_to_all(t, {}, {}, world), std::invalid_argument);     // 5 rows / 2
    EXPECT_THROW(ctx.comm.all_to_all(t, {1, 1}, {5}, world), std::invalid_argument); // 1 size
    EXPECT_THROW(ctx.comm.all_to_all(torch::ones({}), {}, {}, world), std::invalid_argument);
  });
  // Rank 0 expects 2 rows from rank 1, which sends it 1: named by both.
  DeviceMesh other(options(2));
  try {
    run_ranks(other, [&](RankContext& ctx) {
      auto t = torch::ones({4});
      const std::vector<int64_t> out = ctx.rank == 0 ? std::vector<int64_t>{2, 2}
                                                     : std::vector<int64_t>{2, 1};
      const std::vector<int64_t> in = ctx.rank == 0 ? std::vector<int64_t>{2, 2}
                                                    : std::vector<int64_t>{1, 3};
      ctx.comm.all_to_all(t, out, in, Group::world(2));
    });
    FAIL() << "expected a mismatch";
  } catch (const CollectiveMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("member 1 sends member 0 1 rows"), std::string::npos)
        << e.what();
  }
}

TEST(CommAllToAll, IrecvRefusesAMessageThatDoesNotFit) {
  DeviceMesh mesh(options(2));
  run_ranks(mesh, [&](RankContext& ctx) {
    if (ctx.rank == 0) {
      ctx.comm.isend(torch::ones({3}), 1)->wait();
    } else {
      auto out = torch::zeros({4});
      auto work = ctx.comm.irecv(out, 0);
      EXPECT_THROW(work->wait(), std::invalid_argument);
    }
  });
}

TEST(CommAllToAll, PlansRecordEveryPeersBytes) {
  DeviceMesh mesh(options(4, "meta"));
  auto recorders = run_ranks(mesh, [&](RankContext& ctx) {
    auto t = torch::empty({6, 8}, torch::TensorOptions().device(torch::kMeta));
    auto out = ctx.comm.all_to_all(t, {3, 3, 0, 1}, {1, 2, 3, 0}, Group::world(4));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{7, 8}));
  });
  const CollectiveRecord& rec = recorders[2].collectives.at(0);
  EXPECT_EQ(rec.op, "all_to_all");
  EXPECT_EQ(rec.bytes, 6 * 8 * 4);
  EXPECT_EQ(rec.peer_bytes, (std::vector<int64_t>{32, 64, 96, 0})); // rows x 8 floats
}

// One process's rank, started by the test below with its rank in the environment.
TEST(CommAllToAllC10dWorker, DISABLED_OneRank) {
  const char* rank = std::getenv("MESHSIM_A2A_RANK");
  const char* port = std::getenv("MESHSIM_A2A_PORT");
  ASSERT_TRUE(rank && port) << "started by CommAllToAll.C10dGlooExactInProcesses";
  C10dOptions o;
  o.rank = std::atoi(rank);
  o.world_size = 4;
  o.master_port = std::atoi(port);
  o.timeout = std::chrono::milliseconds(60000);
  RunClock clock;
  C10dWorld world(o, clock);
  auto comm = world.make_communicator();
  exchange_and_check(*comm);
  world.store_barrier("a2a-done");
}

TEST(CommAllToAll, C10dGlooExactInProcesses) {
  if (!c10d_available())
    GTEST_SKIP() << "this build has no c10d backend (its LibTorch has no Gloo headers)";
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("meshsim-a2a-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int port = free_port();
  std::ofstream script(dir / "run.sh");
  script << "pids=''\n";
  for (int r = 0; r < 4; ++r)
    script << fmt::format("MESHSIM_A2A_RANK={} MESHSIM_A2A_PORT={} '{}' "
                          "--gtest_also_run_disabled_tests "
                          "--gtest_filter=CommAllToAllC10dWorker.DISABLED_OneRank > '{}/{}.log' "
                          "2>&1 &\npids=\"$pids $!\"\n",
                          r, port, self, dir.string(), r);
  script << "rc=0\nfor p in $pids; do wait $p || rc=1; done\nexit $rc\n";
  script.close();
  const int status = std::system(("bash '" + (dir / "run.sh").string() + "'").c_str());
  std::string logs;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(dir / fmt::format("{}.log", r));
    std::stringstream text;
    text << in.rdbuf();
    logs += fmt::format("--- rank {} ---\n{}\n", r, text.str());
    EXPECT_NE(text.str().find("[  PASSED  ] 1 test"), std::string::npos) << "rank " << r;
  }
  EXPECT_EQ(status, 0) << logs;
  std::filesystem::remove_all(dir);
}

} // namespace meshsim::all_to_all_test
