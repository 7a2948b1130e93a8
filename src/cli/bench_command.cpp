// `meshsim bench comm --cluster SPEC`: an nccl-tests-style table. For each size, the cost
// model's time, algorithm and protocol, algorithm bandwidth and bus bandwidth on the target
// cluster, the bus bandwidth the same model gives at the links' line rate, and, side by side,
// the same collective measured on the in-process backend (rank threads on this machine). Sizes
// follow nccl-tests: all_reduce the buffer, all_gather the total output, reduce_scatter and
// all_to_all (even splits) the total input. all_to_all has no algorithm: "p2p".
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/integer_flag.h"
#include "comm/communicator.h"
#include "cost/collective_cost.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

namespace meshsim {
namespace {

const CollectiveOp kOps[] = {CollectiveOp::AllReduce, CollectiveOp::AllGather,
                             CollectiveOp::ReduceScatter, CollectiveOp::AllToAll};
constexpr int kOpCount = sizeof(kOps) / sizeof(kOps[0]);

std::vector<int64_t> sizes_of(const BenchCommArgs& a, int n) {
  std::vector<int64_t> sizes;
  const int64_t step = 4 * n; // every rank's share is a whole number of floats (n: lcm of both)
  for (int64_t s = a.min_bytes; s <= a.max_bytes; s *= 4)
    sizes.push_back(std::max(step, s / step * step));
  return sizes;
}

// Seconds per call of every (op, size), measured on `n` in-process ranks; rank 0's view
// after a barrier, averaged over `iters` calls after one warm-up.
std::vector<std::vector<double>> measure(int n, const std::vector<int64_t>& sizes, int iters) {
  std::vector<std::vector<double>> seconds(kOpCount, std::vector<double>(sizes.size(), 0));
  MeshOptions mo;
  mo.world_size = n;
  DeviceMesh mesh(mo);
  run_ranks(mesh, [&](RankContext& ctx) {
    const Group world = Group::world(n);
    for (int o = 0; o < kOpCount; ++o)
      for (size_t i = 0; i < sizes.size(); ++i) {
        const int64_t floats = sizes[i] / 4;
        torch::Tensor t = torch::ones({kOps[o] == CollectiveOp::AllGather ? floats / n : floats});
        auto call = [&] {
          if (kOps[o] == CollectiveOp::AllReduce)
            ctx.comm.all_reduce(t, ReduceOp::Sum, world);
          else if (kOps[o] == CollectiveOp::AllGather)
            ctx.comm.all_gather(t, world);
          else if (kOps[o] == CollectiveOp::AllToAll)
            ctx.comm.all_to_all(t, {}, {}, world);
          else
            ctx.comm.reduce_scatter(t, ReduceOp::Sum, world);
        };
        call();
        ctx.comm.barrier(world);
        const double start = ctx.now();
        for (int k = 0; k < iters; ++k)
          call();
        ctx.comm.barrier(world);
        if (ctx.rank == 0)
          seconds[o][i] = (ctx.now() - start) / iters;
      }
  });
  return seconds;
}

std::string human(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30))
    return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (1 << 20))
    return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1 << 10))
    return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

} // namespace

void add_bench_comm_flags(CLI::App& app, BenchCommArgs& a) {
  app.add_option("--cluster", a.cluster, "target cluster: NODESxGPUSxMODEL, GPUSxMODEL or MODEL")
      ->required();
  app.add_option("--intra", a.intra, "link between GPUs of a node");
  app.add_option("--inter", a.inter, "link between nodes");
  add_integer_flag(app, "--gpus", a.gpus,
                   "in-process ranks to measure (default: the cluster's GPUs, at most 8)", /*min=*/1);
  add_integer_flag(app, "--min-bytes", a.min_bytes, "", /*min=*/1)->capture_default_str();
  add_integer_flag(app, "--max-bytes", a.max_bytes, "", /*min=*/1)->capture_default_str();
  add_integer_flag(app, "--iters", a.iters, "timed calls per size", /*min=*/1)->capture_default_str();
  app.add_flag("!--model-only", a.measure, "print the model alone (no in-process measurement)");
  app.add_option("--algorithm", a.algorithm, "all_reduce algorithm: auto | ring | tree | nvls")
      ->capture_default_str();
}

int run_bench_comm(const BenchCommArgs& a) {
  ClusterSpec cluster;
  Algorithm algorithm = Algorithm::Auto;
  try {
    cluster = parse_cluster_spec(a.cluster, a.intra, a.inter);
    algorithm = parse_algorithm(a.algorithm);
    // The model refuses an algorithm the cluster cannot run, in its own words.
    collective_cost(CollectiveOp::AllReduce, 0,
                    group_shape(Group::world(cluster.world_size()).ranks, cluster), cluster,
                    algorithm);
    if (!cluster.note.empty()) fmt::print(stderr, "meshsim: {}\n", cluster.note);
    if (a.min_bytes < 1 || a.max_bytes < a.min_bytes || a.iters < 1)
      throw std::invalid_argument(
          "--min-bytes, --max-bytes and --iters must be positive and ordered");
  } catch (const std::exception& e) {
    return report_failure(e);
  }
  const int n = cluster.world_size();
  const int local = a.gpus > 0 ? a.gpus : std::min(n, 8);
  const auto sizes = sizes_of(a, n * local);
  std::vector<std::vector<double>> measured(kOpCount, std::vector<double>(sizes.size(), 0));
  try {
    if (a.measure)
      measured = measure(local, sizes, a.iters);
  } catch (const std::exception& e) {
    return report_failure(e, "in-process measurement failed: ");
  }
  const GroupShape shape = group_shape(Group::world(n).ranks, cluster);
  const ClusterSpec line_rate = at_line_rate(cluster);
  fmt::print("# meshsim bench comm: model {} ({} GPUs){}\n", cluster.to_string(), n,
             a.measure ? fmt::format(" | measured: in-process backend, {} ranks", local) : "");
  fmt::print("# bandwidths in GB/s (1e9 bytes/s); busbw as nccl-tests defines it; the model's "
             "links at their achieved rate (intra {:.1f} of {:.1f}, inter {:.1f} per GPU of "
             "{:.1f}); \"line busbw\": the same model at line rate\n",
             cluster.intra.achieved() / 1e9, cluster.intra.bandwidth / 1e9,
             cluster.inter_per_gpu() / 1e9, line_rate.inter_per_gpu() / 1e9);
  for (int o = 0; o < kOpCount; ++o) {
    fmt::print("\n# {}\n", to_string(kOps[o]));
    fmt::print("{:>10} {:>12} {:>6} {:>6} {:>10} {:>10} {:>10}", "size", "model us", "algo",
               "proto", "algbw", "busbw", "line busbw");
    if (a.measure)
      fmt::print(" | {:>12} {:>10} {:>10}", "measured us", "algbw", "busbw");
    fmt::print("\n");
    for (size_t i = 0; i < sizes.size(); ++i) {
      const double bytes = static_cast<double>(sizes[i]);
      const CollectiveCost cost = collective_cost(kOps[o], bytes, shape, cluster, algorithm);
      const Bandwidths model = bandwidths(kOps[o], n, bytes, cost.time_s);
      const Bandwidths line = bandwidths(
          kOps[o], n, bytes, collective_cost(kOps[o], bytes, shape, line_rate, algorithm).time_s);
      fmt::print("{:>10} {:>12.2f} {:>6} {:>6} {:>10.2f} {:>10.2f} {:>10.2f}", human(sizes[i]),
                 cost.time_s * 1e6,
                 kOps[o] == CollectiveOp::AllToAll ? "p2p" : to_string(cost.algorithm),
                 to_string(cost.protocol),
                 model.algbw / 1e9, model.busbw / 1e9, line.busbw / 1e9);
      if (a.measure) {
        const Bandwidths local_bw = bandwidths(kOps[o], local, bytes, measured[o][i]);
        fmt::print(" | {:>12.2f} {:>10.2f} {:>10.2f}", measured[o][i] * 1e6, local_bw.algbw / 1e9,
                   local_bw.busbw / 1e9);
      }
      fmt::print("\n");
    }
  }
  return kExitOk;
}

} // namespace meshsim
