// Tests for the collective model (cost/collective_cost.h): every op against its formula,
// written out here from the documented constants (docs/cost-model.md), at two sizes and three
// group sizes; NVLS; NIC sharing; protocol choice; and the line-rate view of `bench comm`.
//
// all_to_all (namespace all_to_all_cost_test below): its formula within a node and across
// nodes (one NIC per GPU), uneven splits set by the busiest rank, replay of hand-built and of
// recorded all_to_alls, and records.json keeping each peer's bytes.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "cost/collective_cost.h"
#include "cost/hardware.h"
#include "cost/predict.h"
#include "cost/replay.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

namespace meshsim {
namespace {

constexpr double kUs = 1e-6;

// NCCL's tuning constants as docs/cost-model.md lists them: { LL, LL128, Simple }.
constexpr double kRingBase[3] = {6.6, 14.0, 8.4};
constexpr double kRingNvlinkHop[3] = {0.6, 1.9, 3.4};
constexpr double kRingNetHop[3] = {2.7, 4.0, 14.0};
constexpr double kTreeBase[3] = {6.8, 14.0, 8.4};
constexpr double kTreeNvlinkHop[3] = {0.6, 1.25, 4.0};
constexpr double kTreeNetHop[3] = {5.0, 8.5, 14.0};
constexpr double kShare[3] = {0.5, 120.0 / 128, 1.0};
constexpr Protocol kProtocols[3] = {Protocol::LL, Protocol::LL128, Protocol::Simple};

double ms(CollectiveOp op, double bytes, const GroupShape& shape, const ClusterSpec& c,
          Algorithm a, Protocol p) {
  return collective_cost(op, bytes, shape, c, a, p).time_s;
}

TEST(CostCollective, EachOpMatchesItsFormulaAtTwoSizesAndThreeGroupSizes) {
  const ClusterSpec c = parse_cluster_spec("8xa100-80");
  const double beta = 300e9 * 232.54 / 300; // NVLink 3's achieved rate
  for (double bytes : {65536.0, 268435456.0})
    for (int n : {2, 4, 8})
      for (int p = 0; p < 3; ++p) {
        const GroupShape g = GroupShape::within_node(n);
        const double hop = kRingNvlinkHop[p] * kUs, base = kRingBase[p] * kUs;
        const double bw = kShare[p] * beta;
        const std::string where = std::to_string(n) + " GPUs, " + std::to_string(bytes) + " B, " +
                                  to_string(kProtocols[p]);
        EXPECT_NEAR(ms(CollectiveOp::AllReduce, bytes, g, c, Algorithm::Ring, kProtocols[p]),
                    base + 2 * (n - 1) * hop + 2.0 * (n - 1) / n * bytes / bw, 1e-15)
            << where;
        EXPECT_NEAR(ms(CollectiveOp::AllReduce, bytes, g, c, Algorithm::Tree, kProtocols[p]),
                    kTreeBase[p] * kUs + 2 * (n - 1) * kTreeNvlinkHop[p] * kUs + 2 * bytes / bw,
                    1e-15)
            << where;
        for (CollectiveOp op : {CollectiveOp::AllGather, CollectiveOp::ReduceScatter})
          EXPECT_NEAR(ms(op, bytes, g, c, Algorithm::Auto, kProtocols[p]),
                      base + (n - 1) * hop + (n - 1.0) / n * bytes / bw, 1e-15)
              << where << " " << to_string(op);
        for (CollectiveOp op : {CollectiveOp::Broadcast, CollectiveOp::Reduce})
          EXPECT_NEAR(ms(op, bytes, g, c, Algorithm::Auto, kProtocols[p]),
                      base + (n - 1) * hop + bytes / bw, 1e-15)
              << where << " " << to_string(op);
        if (n == 2) {
          EXPECT_NEAR(ms(CollectiveOp::SendRecv, bytes, g, c, Algorithm::Auto, kProtocols[p]),
                      base + hop + bytes / bw, 1e-15)
              << where;
        }
      }
}

TEST(CostCollective, AutoTakesTheFastestProtocolAndAlgorithm) {
  const ClusterSpec c = parse_cluster_spec("8xa100-80");
  const GroupShape eight = GroupShape::within_node(8);
  for (double bytes : {1024.0, 4194304.0, 1073741824.0}) {
    double best = 1e30;
    for (Protocol p : kProtocols)
      best = std::min(best, ms(CollectiveOp::AllReduce, bytes, eight, c, Algorithm::Ring, p));
    EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::AllReduce, bytes, eight, c).time_s, best);
  }
  // Latency decides small messages (LL), bandwidth large ones (Simple).
  EXPECT_EQ(collective_cost(CollectiveOp::AllReduce, 1024, eight, c).protocol, Protocol::LL);
  EXPECT_EQ(collective_cost(CollectiveOp::AllReduce, 1 << 30, eight, c).protocol, Protocol::Simple);
  // Bandwidth saturates: a GiB reaches the achieved rate within 1 %, a MiB is far below it.
  const auto busbw = [&](double bytes) {
    const double t = collective_cost(CollectiveOp::AllReduce, bytes, eight, c).time_s;
    return bandwidths(CollectiveOp::AllReduce, 8, bytes, t).busbw;
  };
  EXPECT_NEAR(busbw(4294967296.0), 232.54e9, 232.54e9 * 0.01);
  EXPECT_LT(busbw(1048576.0), 0.5 * 232.54e9);
  // Barrier: a zero-byte all_reduce, LL's latency alone.
  EXPECT_NEAR(collective_cost(CollectiveOp::Barrier, 1e9, eight, c).time_s,
              (6.6 + 14 * 0.6) * kUs, 1e-15);
  EXPECT_EQ(collective_cost(CollectiveOp::AllReduce, 1e9, GroupShape::within_node(1), c).time_s, 0);
}

TEST(CostCollective, SpanningNodesRunsOneRingBoundedByNvlinkOrTheNodesNics) {
  const ClusterSpec c = parse_cluster_spec("4x8xh100");
  const double bytes = 1e9;
  const double nvlink = 450e9 * 232.54 / 300, nic = 50e9 * 4096 / 4122;
  for (int p = 0; p < 3; ++p) {
    const double bw = kShare[p] * std::min(nvlink, 8 * nic);
    // 62 ring steps, 8 of them leave a node.
    EXPECT_NEAR(ms(CollectiveOp::AllReduce, bytes, GroupShape::across(4, 8), c, Algorithm::Ring,
                   kProtocols[p]),
                (kRingBase[p] + 54 * kRingNvlinkHop[p] + 8 * kRingNetHop[p]) * kUs +
                    2.0 * 31 / 32 * bytes / bw,
                1e-15);
    // NCCL's tree: a chain of 8 in each node, a tree of depth 2 over 4 nodes.
    EXPECT_NEAR(ms(CollectiveOp::AllReduce, bytes, GroupShape::across(4, 8), c, Algorithm::Tree,
                   kProtocols[p]),
                (kTreeBase[p] + 14 * kTreeNvlinkHop[p] + 4 * kTreeNetHop[p]) * kUs + 2 * bytes / bw,
                1e-15);
    // One GPU per node: the network alone.
    EXPECT_NEAR(ms(CollectiveOp::AllGather, bytes, GroupShape::across(4, 1), c, Algorithm::Auto,
                   kProtocols[p]),
                (kRingBase[p] + 4 * kRingNetHop[p]) * kUs + 0.75 * bytes / (kShare[p] * nic),
                1e-15);
    // Point-to-point across nodes: one GPU's NIC.
    EXPECT_NEAR(ms(CollectiveOp::SendRecv, bytes, group_shape({0, 8}, c), c, Algorithm::Auto,
                   kProtocols[p]),
                (kRingBase[p] + kRingNetHop[p]) * kUs + bytes / (kShare[p] * nic), 1e-15);
  }
  EXPECT_TRUE(collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::across(4, 8), c)
                  .hierarchical);
  // Crossing nodes costs more than staying inside one.
  EXPECT_GT(collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::across(2, 4), c).time_s,
            collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::within_node(8), c).time_s);
}

TEST(CostCollective, NvlsMovesEachByteOnceWhateverTheGroupSize) {
  const ClusterSpec c = parse_cluster_spec("8xh100");
  const double nvls_bw = c.intra.nvls_efficiency * 450e9;
  for (int n : {5, 6, 7, 8}) {
    const CollectiveCost cost =
        collective_cost(CollectiveOp::AllReduce, 4294967296.0, GroupShape::within_node(n), c);
    EXPECT_EQ(cost.algorithm, Algorithm::Nvls) << n;
    EXPECT_NEAR(cost.time_s, 25 * kUs + 4294967296.0 / nvls_bw, 1e-15);
    // Bus bandwidth grows with n as 2(n-1)/n: the switch does the reduction.
    EXPECT_NEAR(bandwidths(CollectiveOp::AllReduce, n, 4294967296.0, cost.time_s).busbw /
                    (2.0 * (n - 1) / n),
                4294967296.0 / cost.time_s, 1e-3);
  }
  // The calibration row: 480 GB/s bus bandwidth on 8 GPUs at large sizes.
  const double t = collective_cost(CollectiveOp::AllReduce, 4294967296.0,
                                   GroupShape::within_node(8), c).time_s;
  EXPECT_NEAR(bandwidths(CollectiveOp::AllReduce, 8, 4294967296.0, t).busbw, 480e9, 480e9 * 0.01);
  // Small messages stay on the ring: NVLS's latency is larger.
  EXPECT_EQ(collective_cost(CollectiveOp::AllReduce, 65536, GroupShape::within_node(8), c).algorithm,
            Algorithm::Ring);
  // Not on A100's switch, not across nodes, not for all_gather.
  EXPECT_THROW(collective_cost(CollectiveOp::AllReduce, 1e9, GroupShape::within_node(8),
                               parse_cluster_spec("8xa100-80"), Algorithm::Nvls),
               std::invalid_argument);
  EXPECT_THROW(collective_cost(CollectiveOp::AllReduce, 1e9, GroupShape::across(2, 8),
                               parse_cluster_spec("2x8xh100"), Algorithm::Nvls),
               std::invalid_argument);
  EXPECT_NE(collective_cost(CollectiveOp::AllReduce, 1e9, GroupShape::across(2, 8),
                            parse_cluster_spec("2x8xh100")).algorithm,
            Algorithm::Nvls);
}

TEST(CostCollective, NicSharingHalvesInterNodeBandwidthWhenNicsAreHalfTheGpus) {
  const ClusterSpec rails = parse_cluster_spec("2x8xa100-80");
  const ClusterSpec shared = parse_cluster_spec("2x8xa100-80", "", "4xhdr");
  EXPECT_EQ(rails.nics(), 8);
  EXPECT_EQ(shared.nics(), 4);
  EXPECT_EQ(shared.nics_per_node, 4);
  EXPECT_DOUBLE_EQ(shared.inter_per_gpu(), rails.inter_per_gpu() / 2);
  EXPECT_EQ(shared.to_string(), "2x8xa100-80 (intra nvlink3, inter 4xhdr)");
  // More NICs than GPUs give each GPU no more than one NIC.
  EXPECT_DOUBLE_EQ(parse_cluster_spec("2x4xa100-80", "", "8xhdr").inter_per_gpu(),
                   rails.inter_per_gpu());
  // The bandwidth term of a collective over the network doubles; the latency stays.
  const GroupShape rail = GroupShape::across(2, 1);
  for (double bytes : {1e8, 1e9}) {
    const double lat = ms(CollectiveOp::AllGather, 0, rail, rails, Algorithm::Auto, Protocol::Simple);
    const double t8 = ms(CollectiveOp::AllGather, bytes, rail, rails, Algorithm::Auto, Protocol::Simple);
    const double t4 = ms(CollectiveOp::AllGather, bytes, rail, shared, Algorithm::Auto, Protocol::Simple);
    EXPECT_NEAR(t4 - lat, 2 * (t8 - lat), 1e-12) << bytes;
  }
  // The whole node's ring: 8 GPUs on 4 NICs give 4 NICs' bandwidth, under NVLink's.
  const double t = ms(CollectiveOp::AllReduce, 1e9, GroupShape::across(2, 8), shared,
                      Algorithm::Ring, Protocol::Simple);
  const double lat = ms(CollectiveOp::AllReduce, 0, GroupShape::across(2, 8), shared,
                        Algorithm::Ring, Protocol::Simple);
  EXPECT_NEAR(t - lat, 2.0 * 15 / 16 * 1e9 / (4 * 25e9 * 4096 / 4122), 1e-12);
  // Bad NIC counts are one-line errors.
  for (const char* bad : {"0xhdr", "1000001xhdr", "4xfoo"})
    EXPECT_THROW(parse_cluster_spec("2x8xa100", "", bad), std::invalid_argument) << bad;
}

TEST(CostCollective, LineRateIsTheSameModelWithEveryLinkAtItsDatasheetRate) {
  const ClusterSpec c = parse_cluster_spec("2x8xh100", "", "4xndr");
  const ClusterSpec line = at_line_rate(c);
  EXPECT_DOUBLE_EQ(line.intra.achieved(), 450e9);
  EXPECT_DOUBLE_EQ(line.inter_per_gpu(), 25e9);
  EXPECT_EQ(line.nics_per_node, 4);
  for (double bytes : {1e3, 1e6, 1e9})
    EXPECT_LT(collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::across(2, 8), line).time_s,
              collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::across(2, 8), c).time_s);
}

TEST(CostCollective, ForcingAnAlgorithmThatCannotRunTheOpIsAnError) {
  const ClusterSpec c = parse_cluster_spec("8xa100-80");
  EXPECT_THROW(collective_cost(CollectiveOp::AllGather, 1e6, GroupShape::within_node(8), c,
                               Algorithm::Tree, Protocol::Simple),
               std::invalid_argument);
  // The general overload applies the choice to all_reduce only.
  EXPECT_EQ(collective_cost(CollectiveOp::AllGather, 1e6, GroupShape::within_node(8), c,
                            Algorithm::Tree).algorithm,
            Algorithm::Ring);
  EXPECT_THROW(collective_cost(CollectiveOp::SendRecv, 1e6, GroupShape::within_node(3), c),
               std::invalid_argument);
  EXPECT_THROW(collective_cost(CollectiveOp::AllReduce, -1, GroupShape::within_node(3), c),
               std::invalid_argument);
  EXPECT_EQ(parse_algorithm("nvls"), Algorithm::Nvls);
  EXPECT_THROW(parse_algorithm("butterfly"), std::invalid_argument);
}

} // namespace
} // namespace meshsim

namespace meshsim::all_to_all_cost_test {

constexpr double kUs = 1e-6;
// NCCL's ring constants { LL, LL128, Simple }: a send/recv step's latency.
constexpr double kBase[3] = {6.6, 14.0, 8.4};
constexpr double kNvlinkHop[3] = {0.6, 1.9, 3.4};
constexpr double kNetHop[3] = {2.7, 4.0, 14.0};
constexpr double kShare[3] = {0.5, 120.0 / 128, 1.0};
constexpr Protocol kProtocols[3] = {Protocol::LL, Protocol::LL128, Protocol::Simple};
// Achieved rates: NVLink 25 GB/s per link per direction x 232.54/300; NDR 400 Gb/s per NIC x
// 4096/4122 (InfiniBand's packet share).
constexpr double kNvlink3 = 12 * 25e9 * 232.54 / 300;
constexpr double kNvlink4 = 18 * 25e9 * 232.54 / 300;
constexpr double kNdr = 400e9 / 8 * 4096 / (4096 + 26);

// The fastest protocol of: latency of one step + the busiest bytes on each link, concurrently.
double expected(double intra_bytes, double inter_bytes, double intra_bw, double nic_bw,
                bool spans_nodes) {
  double best = 1e30;
  for (int p = 0; p < 3; ++p) {
    double t = intra_bytes / (kShare[p] * intra_bw);
    if (spans_nodes)
      t = std::max(t, inter_bytes / (kShare[p] * nic_bw));
    best = std::min(best, (kBase[p] + (spans_nodes ? kNetHop[p] : kNvlinkHop[p])) * kUs + t);
  }
  return best;
}

TEST(CostAllToAll, WithinANodeMatchesItsFormula) {
  const ClusterSpec c = parse_cluster_spec("8xa100-80");
  for (double bytes : {65536.0, 268435456.0})
    for (int n : {2, 4, 8})
      for (int p = 0; p < 3; ++p) {
        const double want = (kBase[p] + kNvlinkHop[p]) * kUs + (n - 1.0) / n * bytes /
                                                                   (kShare[p] * kNvlink3);
        EXPECT_NEAR(collective_cost(CollectiveOp::AllToAll, bytes, GroupShape::within_node(n), c,
                                    Algorithm::Auto, kProtocols[p])
                        .time_s,
                    want, 1e-15)
            << n << " GPUs, " << bytes << " B";
      }
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::AllToAll, 8), 7.0 / 8);
  EXPECT_EQ(parse_collective_op("all_to_all"), CollectiveOp::AllToAll);
  EXPECT_EQ(parse_collective_op("alltoall"), CollectiveOp::AllToAll);
  EXPECT_STREQ(to_string(CollectiveOp::AllToAll), "all_to_all");
}

TEST(CostAllToAll, AcrossNodesOneNicPerGpu) {
  // 2 nodes of 8 H100: 7/16 of the buffer on NVLink, 8/16 through the GPU's own NIC.
  const ClusterSpec c = parse_cluster_spec("2x8xh100");
  const GroupShape s = GroupShape::across(2, 8);
  for (double bytes : {1048576.0, 1073741824.0})
    EXPECT_NEAR(collective_cost(CollectiveOp::AllToAll, bytes, s, c).time_s,
                expected(7.0 / 16 * bytes, 8.0 / 16 * bytes, kNvlink4, kNdr, true), 1e-15);
  // Four NICs shared by eight GPUs: each GPU gets half of one, and never more than one (an
  // all_gather's ring drives all of the node's NICs at once).
  const ClusterSpec shared = parse_cluster_spec("2x8xh100", "", "4xndr");
  const double gib = 1073741824.0;
  EXPECT_NEAR(collective_cost(CollectiveOp::AllToAll, gib, s, shared).time_s,
              expected(7.0 / 16 * gib, 8.0 / 16 * gib, kNvlink4, kNdr / 2, true), 1e-15);
  const double gather = collective_cost(CollectiveOp::AllGather, gib, s, c).time_s;
  EXPECT_GT(collective_cost(CollectiveOp::AllToAll, gib, s, c).time_s, gather);
}

TEST(CostAllToAll, UnevenSplitsAreSetByTheBusiestRank) {
  const ClusterSpec c = parse_cluster_spec("8xa100-80");
  // Member 2 receives 3 + 5 + 1 MB from the others, more than anyone sends or receives.
  const double mb = 1e6;
  const std::vector<std::vector<double>> m{{9 * mb, 1 * mb, 3 * mb, 0},
                                           {2 * mb, 0, 5 * mb, 1 * mb},
                                           {1 * mb, 1 * mb, 7 * mb, 1 * mb},
                                           {0, 2 * mb, 1 * mb, 0}};
  const CollectiveCost cost = all_to_all_cost(m, {0, 1, 2, 3}, c);
  EXPECT_NEAR(cost.time_s, expected(9 * mb, 0, kNvlink3, 0, false), 1e-15);
  EXPECT_FALSE(cost.hierarchical);
  // Even rows: the even formula.
  const std::vector<std::vector<double>> even(4, std::vector<double>(4, 2 * mb));
  EXPECT_DOUBLE_EQ(all_to_all_cost(even, {0, 1, 2, 3}, c).time_s,
                   collective_cost(CollectiveOp::AllToAll, 8 * mb, GroupShape::within_node(4), c)
                       .time_s);
  // Across nodes: ranks 0, 1 on node 0 and 8, 9 on node 1 of 2x8xh100; rank 0 sends 6 MB to
  // node 1 and 1 MB to rank 1: the NIC's 6 MB set the time.
  const ClusterSpec two = parse_cluster_spec("2x8xh100");
  const std::vector<std::vector<double>> x{
      {0, 1 * mb, 3 * mb, 3 * mb}, {1 * mb, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  EXPECT_NEAR(all_to_all_cost(x, {0, 1, 8, 9}, two).time_s,
              expected(1 * mb, 6 * mb, kNvlink4, kNdr, true), 1e-15);
  EXPECT_THROW(all_to_all_cost({{0, 1}, {1}}, {0, 1}, c), std::invalid_argument);
  EXPECT_THROW(all_to_all_cost({{0, -1}, {1, 0}}, {0, 1}, c), std::invalid_argument);
}

TEST(CostAllToAll, ReplayTimesEachMembersSplit) {
  const ClusterSpec c = parse_cluster_spec("8xa100-80");
  const std::vector<std::vector<double>> m{{0, 4e6, 1e6}, {1e6, 0, 1e6}, {2e6, 1e6, 0}};
  Program program;
  program.ranks.resize(3);
  for (int r = 0; r < 3; ++r) {
    Task t = Task::comm("a2a" + std::to_string(r), CollectiveOp::AllToAll, {0, 1, 2}, 5e6);
    t.peer_bytes = m[static_cast<size_t>(r)];
    program.ranks[static_cast<size_t>(r)].push_back(t);
  }
  const ReplayResult result = replay(program, c);
  // Rank 1 receives 4 + 1 MB: the busiest.
  EXPECT_NEAR(result.makespan_s, expected(5e6, 0, kNvlink3, 0, false), 1e-15);
  // A plan's absent ranks send as the first present one, shifted to their place.
  Program images;
  images.ranks.resize(3);
  images.ranks[0] = {program.ranks[0][0]};
  ReplayOptions o;
  o.absent_ranks_are_images = true;
  const std::vector<std::vector<double>> rotated{{0, 4e6, 1e6}, {1e6, 0, 4e6}, {4e6, 1e6, 0}};
  EXPECT_DOUBLE_EQ(replay(images, c, o).makespan_s, all_to_all_cost(rotated, {0, 1, 2}, c).time_s);
}

TEST(CostAllToAll, RecordedAllToAllReplaysToItsFormula) {
  MeshOptions mo;
  mo.world_size = 4;
  mo.capacity_bytes = int64_t{1} << 30;
  DeviceMesh mesh(mo);
  // Rank r sends (r + j) % 3 rows of 1024 floats to member j.
  auto recorders = run_ranks(mesh, [&](RankContext& ctx) {
    std::vector<int64_t> in, out;
    for (int j = 0; j < 4; ++j) {
      in.push_back((ctx.rank + j) % 3);
      out.push_back((j + ctx.rank) % 3);
    }
    int64_t rows = 0;
    for (int64_t r : in)
      rows += r;
    ctx.comm.all_to_all(torch::ones({rows, 1024}), out, in, Group::world(4));
  });
  std::vector<Recorder> ranks(4);
  for (int r = 0; r < 4; ++r) {
    ComputeRecord before, after;
    before.name = after.name = "forward";
    before.step = 0;
    after.step = 1;
    const CollectiveRecord& rec = recorders[static_cast<size_t>(r)].collectives.at(0);
    before.start_s = rec.start_s - 1e-3;
    before.end_s = rec.start_s;
    after.start_s = after.end_s = rec.end_s + 1e-3;
    ranks[static_cast<size_t>(r)].compute = {before, after};
    ranks[static_cast<size_t>(r)].collectives = {rec};
  }
  // records.json keeps each peer's bytes.
  int64_t samples = 0;
  const auto back = records_from_json(records_to_json(ranks, 1), &samples);
  ASSERT_EQ(back[1].collectives.at(0).peer_bytes, (std::vector<int64_t>{4096, 8192, 0, 4096}));
  const ClusterSpec c = parse_cluster_spec("4xa100-80");
  PredictOptions o;
  o.measured_compute = true;
  const Program program = build_step_program(back, 0, c.gpu, o);
  const ReplayResult result = replay(program, c);
  double a2a = -1;
  for (const TaskTiming& t : result.tasks)
    if (t.id.find("all_to_all") != std::string::npos)
      a2a = t.end_s - t.start_s;
  // Rank r keeps (2r) % 3 rows of its own: rank 2 sends (and receives) 2 + 0 + 2 rows to (from)
  // the others, 16384 bytes each way, the most.
  EXPECT_NEAR(a2a, expected(4 * 4096, 0, kNvlink3, 0, false), 1e-15);
}

TEST(CostAllToAll, OldRecordsWithoutPeerBytesStayReadable) {
  std::vector<Recorder> ranks(2);
  for (Recorder& r : ranks)
    r.collectives.push_back({"all_reduce", {0, 1}, 64, 0, -1, 0.0, 0.1});
  nlohmann::json doc = records_to_json(ranks, 1);
  EXPECT_FALSE(doc["ranks"][0]["collectives"][0].contains("peer_bytes"));
  EXPECT_TRUE(records_from_json(doc, nullptr)[0].collectives[0].peer_bytes.empty());
  doc["ranks"][0]["collectives"][0]["peer_bytes"] = {1, 2, 3};
  EXPECT_THROW(records_from_json(doc, nullptr), std::exception);
}

} // namespace meshsim::all_to_all_cost_test
