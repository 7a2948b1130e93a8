// Tests for the replay: hand-built per-rank programs with answers derived on paper
// (overlap, GPipe bubble, DDP bucket overlap), error cases, and the predicted DDP scaling
// table that docs/cost-model.md reproduces.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cost/replay.h"

namespace meshsim {
namespace {

std::string id(const std::string& name, int rank, int index = -1) {
  return name + std::to_string(rank) + (index < 0 ? "" : "." + std::to_string(index));
}

// (a) Two ranks: 10 ms compute, then an all-reduce that needs it, while an independent compute
// of `later_s` runs on the compute stream; an "after" task needs the all-reduce.
Program overlap_program(double ar_s, double later_s) {
  Program program;
  for (int r = 0; r < 2; ++r) {
    Task ar = Task::comm(id("ar", r), CollectiveOp::AllReduce, {0, 1}, 1e6, {id("c", r)});
    ar.duration_s = ar_s;
    program.ranks.push_back({Task::compute(id("c", r), 10e-3), ar,
                             Task::compute(id("later", r), later_s),
                             Task::compute(id("after", r), 0, {id("ar", r)})});
  }
  return program;
}

TEST(CostReplay, OverlappedAllReduceIsNotExposed) {
  const ReplayResult result = replay(overlap_program(1e-3, 5e-3), parse_cluster_spec("2xa100-80"));
  EXPECT_NEAR(result.task("ar0").start_s, 10e-3, 1e-15);
  EXPECT_NEAR(result.task("ar1").end_s, 11e-3, 1e-15);
  EXPECT_NEAR(result.makespan_s, 15e-3, 1e-15); // 10 + max(1, 5)
  for (const RankStats& rank : result.ranks) {
    EXPECT_NEAR(rank.exposed_comm_s, 0, 1e-15);
    EXPECT_NEAR(rank.compute_busy_s, 15e-3, 1e-15);
    EXPECT_NEAR(rank.comm_busy_s, 1e-3, 1e-15);
  }
  EXPECT_NEAR(result.bubble_fraction, 0, 1e-12);
}

TEST(CostReplay, PartlyOverlappedAllReduceExposesTheRest) {
  // 1 ms all-reduce beside 0.25 ms of compute: 0.75 ms of it is on the critical timeline.
  const ReplayResult result =
      replay(overlap_program(1e-3, 0.25e-3), parse_cluster_spec("2xa100-80"));
  EXPECT_NEAR(result.makespan_s, 11e-3, 1e-15);
  EXPECT_NEAR(result.ranks[0].exposed_comm_s, 0.75e-3, 1e-15);
  EXPECT_NEAR(result.max_exposed_comm_s(), 0.75e-3, 1e-15);
  EXPECT_NEAR(result.bubble_fraction, 0.75e-3 / 11e-3, 1e-12);
}

TEST(CostReplay, ModelledDurationsComeFromTheCostModel) {
  const ClusterSpec cluster = parse_cluster_spec("2xa100-80");
  Program program = overlap_program(-1, 0); // -1: cost the all-reduce with the α–β model
  const ComputeWork gemm = matmul_work(4096, 4096, 4096, Dtype::BF16);
  program.ranks[0][2] = Task::compute("later0", gemm);
  program.ranks[1][2] = Task::compute("later1", gemm);
  ReplayOptions options;
  options.algorithm = Algorithm::Ring;
  const ReplayResult result = replay(program, cluster, options);
  const double ar = collective_cost(CollectiveOp::AllReduce, 1e6, GroupShape::within_node(2),
                                    cluster, Algorithm::Ring)
                        .time_s;
  EXPECT_NEAR(result.task("ar0").end_s - result.task("ar0").start_s, ar, 1e-15);
  EXPECT_NEAR(result.task("later1").end_s - result.task("later1").start_s,
              roofline(gemm, cluster.gpu).time_s, 1e-15);
}

TEST(CostReplay, CollectiveWaitsForItsSlowestMember) {
  Program program;
  program.ranks.push_back({Task::compute("c0", 10e-3),
                           Task::comm("ar0", CollectiveOp::AllReduce, {0, 1}, 0, {"c0"}, "grad")});
  program.ranks.push_back({Task::compute("c1", 20e-3),
                           Task::comm("ar1", CollectiveOp::AllReduce, {0, 1}, 0, {"c1"}, "grad")});
  program.ranks[0][1].duration_s = 2e-3;
  const ReplayResult result = replay(program, parse_cluster_spec("2xh100"));
  EXPECT_NEAR(result.task("ar0").ready_s, 10e-3, 1e-15);
  EXPECT_NEAR(result.task("ar0").start_s, 20e-3, 1e-15);
  EXPECT_NEAR(result.task("ar0").end_s, 22e-3, 1e-15);
  EXPECT_NEAR(result.task("ar1").end_s, 22e-3, 1e-15);
  // Waiting for the peer is idle time, not communication.
  EXPECT_NEAR(result.ranks[0].exposed_comm_s, 2e-3, 1e-15);
  EXPECT_NEAR(result.ranks[0].compute_idle_s, 12e-3, 1e-15);
}

// With absent ranks as images, a collective completes with its present members, is costed
// over its whole group, and a present member that skips it is still an error.
TEST(CostReplay, AbsentRanksAreImagesOfPresentOnes) {
  Program program{std::vector<std::vector<Task>>(4)};
  program.ranks[0] = {Task::compute("c0", 10e-3),
                      Task::comm("ar0", CollectiveOp::AllReduce, {0, 1, 2, 3}, 64e6, {"c0"})};
  ReplayOptions images;
  images.absent_ranks_are_images = true;
  const ClusterSpec cluster = parse_cluster_spec("4xh100");
  const ReplayResult result = replay(program, cluster, images);
  const double cost =
      collective_cost(CollectiveOp::AllReduce, 64e6, group_shape({0, 1, 2, 3}, cluster), cluster,
                      Algorithm::Auto)
          .time_s;
  EXPECT_NEAR(result.task("ar0").start_s, 10e-3, 1e-15);
  EXPECT_NEAR(result.task("ar0").end_s, 10e-3 + cost, 1e-15);
  EXPECT_NEAR(result.bubble_fraction, cost / (10e-3 + cost), 1e-12); // rank 0's alone
  EXPECT_THROW(replay(program, cluster), std::invalid_argument); // not without the option
  program.ranks[1] = {Task::compute("c1", 10e-3)}; // present, but never joins
  EXPECT_THROW(replay(program, cluster, images), std::invalid_argument);
}

// (b) GPipe: all forwards, then all backwards; activations and gradients move by zero-cost
// send/recv pairs, matched by NCCL's order rule (no explicit keys).
Program gpipe(int stages, int micro, double f, double b) {
  Program program{std::vector<std::vector<Task>>(static_cast<size_t>(stages))};
  auto p2p = [](std::string name, int from, int to, std::vector<std::string> deps) {
    Task t = Task::comm(std::move(name), CollectiveOp::SendRecv, {from, to}, 1e6, std::move(deps));
    t.duration_s = 0;
    return t;
  };
  for (int s = 0; s < stages; ++s) {
    auto& tasks = program.ranks[static_cast<size_t>(s)];
    for (int m = 0; m < micro; ++m) {
      std::vector<std::string> deps;
      if (s > 0)
        tasks.push_back(p2p(id("recv_f", s, m), s - 1, s, {}));
      if (s > 0)
        deps.push_back(id("recv_f", s, m));
      tasks.push_back(Task::compute(id("F", s, m), f, deps));
      if (s + 1 < stages)
        tasks.push_back(p2p(id("send_f", s, m), s, s + 1, {id("F", s, m)}));
    }
    for (int m = 0; m < micro; ++m) {
      std::vector<std::string> deps;
      if (s + 1 < stages)
        tasks.push_back(p2p(id("recv_b", s, m), s + 1, s, {}));
      if (s + 1 < stages)
        deps.push_back(id("recv_b", s, m));
      tasks.push_back(Task::compute(id("B", s, m), b, deps));
      if (s > 0)
        tasks.push_back(p2p(id("send_b", s, m), s, s - 1, {id("B", s, m)}));
    }
  }
  return program;
}

TEST(CostReplay, GPipeMakespanAndBubbleMatchClosedForm) {
  const double f = 1.0 / 128, b = 2.0 / 128; // dyadic: sums are exact in binary
  for (auto [stages, micro] : {std::pair{4, 8}, {2, 1}, {3, 5}, {8, 32}, {1, 4}}) {
    const ReplayResult result = replay(gpipe(stages, micro, f, b), parse_cluster_spec("8xh100"));
    EXPECT_DOUBLE_EQ(result.makespan_s, (micro + stages - 1) * (f + b)) << stages << "x" << micro;
    EXPECT_DOUBLE_EQ(result.bubble_fraction,
                     static_cast<double>(stages - 1) / (micro + stages - 1));
    for (const RankStats& rank : result.ranks) {
      EXPECT_DOUBLE_EQ(rank.compute_busy_s, micro * (f + b));
      EXPECT_DOUBLE_EQ(rank.exposed_comm_s, 0);
    }
    // Last stage starts its first backward right after its last forward.
    EXPECT_DOUBLE_EQ(result.task(id("B", stages - 1, 0)).start_s, (micro + stages - 1) * f);
  }
}

// A DDP step: forward, backward in `buckets.size()` chunks (time proportional to the bucket's
// bytes), one all-reduce per bucket as soon as its chunk is done, optimizer after all of them.
Program ddp_step(int ranks, const std::vector<double>& buckets, const ComputeWork& forward,
                 const ComputeWork& backward, const ComputeWork& optimizer) {
  double total = 0;
  for (double bytes : buckets)
    total += bytes;
  std::vector<int> world(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    world[static_cast<size_t>(r)] = r;
  Program program;
  for (int r = 0; r < ranks; ++r) {
    std::vector<Task> tasks{Task::compute(id("fwd", r), forward)};
    std::vector<std::string> all_reduces;
    for (size_t k = 0; k < buckets.size(); ++k) {
      ComputeWork chunk = backward;
      chunk.flops *= buckets[k] / total;
      chunk.bytes *= buckets[k] / total;
      const int i = static_cast<int>(k);
      tasks.push_back(Task::compute(id("bwd", r, i), chunk));
      if (ranks > 1) {
        tasks.push_back(Task::comm(id("ar", r, i), CollectiveOp::AllReduce, world, buckets[k],
                                   {id("bwd", r, i)}));
        all_reduces.push_back(id("ar", r, i));
      }
    }
    tasks.push_back(Task::compute(id("opt", r), optimizer, all_reduces));
    program.ranks.push_back(std::move(tasks));
  }
  return program;
}

// PyTorch DDP's default bucket_cap_mb = 25.
std::vector<double> buckets_of(double grad_bytes, double cap = 25e6) {
  std::vector<double> buckets;
  for (double left = grad_bytes; left > 0; left -= cap)
    buckets.push_back(std::min(cap, left));
  return buckets;
}

TEST(CostReplay, DdpBucketsExposeOnlyTheLastAllReduce) {
  const ClusterSpec cluster = parse_cluster_spec("4xa100-80");
  const ComputeWork fwd{1e12, 0, OpClass::Matmul, Dtype::BF16};
  const ComputeWork bwd{2e12, 0, OpClass::Matmul, Dtype::BF16};
  const ComputeWork opt = elementwise_work(1e7, 4, 3, 10, Dtype::FP32);
  for (double grad_bytes : {57e6, 110e6, 250e6}) { // 3, 5 and 10 buckets, last one smaller
    const std::vector<double> buckets = buckets_of(grad_bytes);
    const ReplayResult result = replay(ddp_step(4, buckets, fwd, bwd, opt), cluster);
    const double last_ar = collective_cost(CollectiveOp::AllReduce, buckets.back(),
                                           GroupShape::within_node(4), cluster)
                               .time_s;
    // Every earlier bucket must fit under the next backward chunk for the claim to hold.
    const double chunk = roofline(bwd, cluster.gpu).time_s * 25e6 / grad_bytes;
    ASSERT_LT(
        collective_cost(CollectiveOp::AllReduce, 25e6, GroupShape::within_node(4), cluster).time_s,
        chunk);
    for (const RankStats& rank : result.ranks)
      EXPECT_NEAR(rank.exposed_comm_s, last_ar, 1e-15);
    const double compute = roofline(fwd, cluster.gpu).time_s + roofline(bwd, cluster.gpu).time_s +
                           roofline(opt, cluster.gpu).time_s;
    EXPECT_NEAR(result.makespan_s, compute + last_ar, 1e-12);
  }
}

TEST(CostReplay, TensorParallelAllReduceBlocksLaterCompute) {
  Program program;
  for (int r = 0; r < 2; ++r) {
    Task ar = Task::comm(id("tp_ar", r), CollectiveOp::AllReduce, {0, 1}, 0, {id("mlp", r)});
    ar.duration_s = 3e-3;
    program.ranks.push_back({Task::compute(id("mlp", r), 4e-3), ar,
                             Task::compute(id("next", r), 4e-3, {id("tp_ar", r)})});
  }
  const ReplayResult result = replay(program, parse_cluster_spec("2xh100"));
  EXPECT_NEAR(result.task("next0").start_s, 7e-3, 1e-15);
  EXPECT_NEAR(result.makespan_s, 11e-3, 1e-15);
  EXPECT_NEAR(result.ranks[1].exposed_comm_s, 3e-3, 1e-15);
}

TEST(CostReplay, CollectivesIssuedInDifferentOrdersDeadlock) {
  Program program;
  program.ranks.push_back({Task::comm("a0", CollectiveOp::AllReduce, {0, 1}, 0, {}, "A"),
                           Task::comm("b0", CollectiveOp::AllReduce, {0, 1}, 0, {}, "B")});
  program.ranks.push_back({Task::comm("b1", CollectiveOp::AllReduce, {0, 1}, 0, {}, "B"),
                           Task::comm("a1", CollectiveOp::AllReduce, {0, 1}, 0, {}, "A")});
  try {
    replay(program, parse_cluster_spec("2xh100"));
    FAIL() << "expected a deadlock";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a0"), std::string::npos) << e.what();
  }
}

TEST(CostReplay, MalformedProgramsAreRejected) {
  const ClusterSpec cluster = parse_cluster_spec("2xh100");
  Program duplicate{{{Task::compute("x", 1)}, {Task::compute("x", 1)}}};
  EXPECT_THROW(replay(duplicate, cluster), std::invalid_argument);
  Program unknown_dep{{{Task::compute("x", 1, {"nope"})}}};
  EXPECT_THROW(replay(unknown_dep, cluster), std::invalid_argument);
  Program missing_member{{{Task::comm("a", CollectiveOp::AllReduce, {0, 1}, 8)}, {}}};
  EXPECT_THROW(replay(missing_member, cluster), std::invalid_argument);
  Program size_mismatch{{{Task::comm("a", CollectiveOp::AllReduce, {0, 1}, 8)},
                         {Task::comm("b", CollectiveOp::AllReduce, {0, 1}, 16)}}};
  EXPECT_THROW(replay(size_mismatch, cluster), std::invalid_argument);
  Program too_many_ranks{std::vector<std::vector<Task>>(3)};
  EXPECT_THROW(replay(too_many_ranks, cluster), std::invalid_argument);
}

// (3) Predicted weak scaling of a DDP step: fixed per-GPU batch, so efficiency = T(1) / T(n).
struct Workload {
  const char* name;
  double step_flops; // forward + backward, one GPU's batch
  double params;     // fp32 gradients: 4 bytes each
};
// ResNet-50: 25.6M params, ~8.2 GFLOP forward per 224px image (2 x 4.1 GMAC), backward 2x
// forward; batch 256 per GPU. "Large": ~375M params (GPT-2-medium size), 6 * params * tokens
// with 8 x 1024 tokens per GPU, and 1.5e9 bytes of fp32 gradients.
const Workload kCnn{"resnet50-size", 3 * 8.2e9 * 256, 25.6e6};
const Workload kLarge{"375M-param", 6 * 375e6 * 8 * 1024, 375e6};

double step_time(const Workload& w, const ClusterSpec& cluster) {
  const ComputeWork fwd{w.step_flops / 3, 0, OpClass::Matmul, Dtype::BF16};
  const ComputeWork bwd{2 * w.step_flops / 3, 0, OpClass::Matmul, Dtype::BF16};
  // Adam in fp32: read param, grad, m, v; write param, m, v; ~10 FLOPs per parameter.
  ComputeWork opt = elementwise_work(w.params, 4, 3, 10, Dtype::FP32);
  opt.op = OpClass::Optimizer;
  constexpr double kGradBytes = 4;
  const Program step =
      ddp_step(cluster.world_size(), buckets_of(w.params * kGradBytes), fwd, bwd, opt);
  return replay(step, cluster).makespan_s;
}

TEST(CostScaling, DdpScalesOnNvlinkAndDegradesOnPcie3) {
  const int counts[] = {1, 2, 4, 8};
  const struct {
    const Workload* workload;
    const char* link;
  } columns[] = {{&kCnn, "nvlink3"}, {&kCnn, "pcie3"}, {&kLarge, "nvlink3"}, {&kLarge, "pcie3"}};
  double efficiency[4][4] = {};
  std::printf("| GPUs | %s nvlink3 | %s pcie3 | %s nvlink3 | %s pcie3 |\n", kCnn.name, kCnn.name,
              kLarge.name, kLarge.name);
  std::printf("|---:|---:|---:|---:|---:|\n");
  for (int i = 0; i < 4; ++i) {
    std::printf("| %d |", counts[i]);
    for (int c = 0; c < 4; ++c) {
      const std::string spec = std::to_string(counts[i]) + "xa100-80";
      const double t1 = step_time(*columns[c].workload, parse_cluster_spec("1xa100-80"));
      const double tn = step_time(*columns[c].workload, parse_cluster_spec(spec, columns[c].link));
      efficiency[c][i] = t1 / tn;
      std::printf(" %.2f ms, %.2fx, eff %.3f |", tn * 1e3, counts[i] * t1 / tn, efficiency[c][i]);
    }
    std::printf("\n");
  }
  EXPECT_GT(efficiency[0][3], 0.9); // CNN on NVLink: near linear at 8
  EXPECT_GT(efficiency[2][3], 0.9); // the large model hides its all-reduce behind backward
  EXPECT_LT(efficiency[3][3], efficiency[2][3] - 0.3); // ... unless the link is PCIe 3
  EXPECT_LT(efficiency[3][3], efficiency[0][3]);
  for (int c = 0; c < 4; ++c)
    for (int i = 1; i < 4; ++i) {
      EXPECT_LE(efficiency[c][i], efficiency[c][i - 1] + 1e-12) << c << " " << i;
      EXPECT_GT(counts[i] * efficiency[c][i], counts[i - 1] * efficiency[c][i - 1] * 0.99)
          << "throughput should not collapse";
    }
}

} // namespace
} // namespace meshsim
