// Collective cost model: implementation of the α–β formulas and the hierarchical composition
// for groups that span nodes. See collective_cost.h and docs/cost-model.md.
#include "cost/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace meshsim {
namespace {

double alpha(const LinkSpec& link) {
  return link.latency;
}
double beta(const LinkSpec& link) {
  if (link.bandwidth <= 0)
    throw std::invalid_argument("link \"" + link.name + "\" has no bandwidth");
  return link.bandwidth;
}

int ceil_log2(int n) {
  int depth = 0;
  while ((1 << depth) < n)
    ++depth;
  return depth;
}

void check(int n, double bytes) {
  if (n < 1)
    throw std::invalid_argument("collective: group size must be >= 1");
  if (bytes < 0)
    throw std::invalid_argument("collective: negative byte count");
}

// The inter-node stage moves a node's data through ranks_per_node NICs in parallel ("rails"):
// one NIC per GPU, as on DGX/HGX systems.
LinkSpec rails(const LinkSpec& inter, int ranks_per_node) {
  LinkSpec wide = inter;
  wide.bandwidth = inter.bandwidth * ranks_per_node;
  return wide;
}

CollectiveCost pick_all_reduce(int n, double bytes, const LinkSpec& link, Algorithm algorithm) {
  const double ring = ring_all_reduce_time(n, bytes, link);
  const double tree = tree_all_reduce_time(n, bytes, link);
  if (algorithm == Algorithm::Ring || (algorithm == Algorithm::Auto && ring <= tree))
    return {ring, Algorithm::Ring, false};
  return {tree, Algorithm::Tree, false};
}

// Spanning nodes: intra reduce-scatter, then every local rank all-reduces its 1/g shard with
// the same local rank of the other nodes (one rail each, all rails at once), then intra
// all-gather. NCCL does the same for its tree; for the ring it gives the same bandwidth term
// and fewer network hops.
CollectiveCost hierarchical_all_reduce(double bytes, const GroupShape& s, const LinkSpec& intra,
                                       const LinkSpec& inter, Algorithm algorithm) {
  const int g = s.ranks_per_node;
  const double intra_stages = 2 * ring_all_gather_time(g, bytes, intra);
  CollectiveCost cost = pick_all_reduce(s.nodes, bytes / g, inter, algorithm);
  cost.time_s += intra_stages;
  cost.hierarchical = true;
  return cost;
}

// all_gather spanning nodes: rails all-gather their shards across nodes (each rank ends with
// B/g), then the node all-gathers the full B. reduce_scatter is the mirror image.
double hierarchical_all_gather(double total_bytes, const GroupShape& s, const LinkSpec& intra,
                               const LinkSpec& inter) {
  const int g = s.ranks_per_node;
  return ring_all_gather_time(s.nodes, total_bytes / g, inter) +
         ring_all_gather_time(g, total_bytes, intra);
}

// A chain through every rank: nodes*(g-1) hops inside nodes and nodes-1 hops between them;
// g chains run at once over the g rails, so the slower of NVLink and g NICs bounds the flow.
double hierarchical_chain(double bytes, const GroupShape& s, const LinkSpec& intra,
                          const LinkSpec& inter) {
  const int g = s.ranks_per_node;
  const double hops_latency = s.nodes * (g - 1) * alpha(intra) + (s.nodes - 1) * alpha(inter);
  const double bottleneck = std::min(beta(intra), beta(rails(inter, g)));
  return hops_latency + bytes / bottleneck;
}

} // namespace

CollectiveOp parse_collective_op(const std::string& name) {
  if (name == "all_reduce" || name == "allreduce")
    return CollectiveOp::AllReduce;
  if (name == "all_gather" || name == "allgather")
    return CollectiveOp::AllGather;
  if (name == "reduce_scatter" || name == "reducescatter")
    return CollectiveOp::ReduceScatter;
  if (name == "broadcast")
    return CollectiveOp::Broadcast;
  if (name == "reduce")
    return CollectiveOp::Reduce;
  if (name == "send" || name == "recv" || name == "sendrecv")
    return CollectiveOp::SendRecv;
  if (name == "barrier")
    return CollectiveOp::Barrier;
  throw std::invalid_argument("unknown collective \"" + name + "\"");
}

const char* to_string(CollectiveOp op) {
  switch (op) {
  case CollectiveOp::AllReduce:
    return "all_reduce";
  case CollectiveOp::AllGather:
    return "all_gather";
  case CollectiveOp::ReduceScatter:
    return "reduce_scatter";
  case CollectiveOp::Broadcast:
    return "broadcast";
  case CollectiveOp::Reduce:
    return "reduce";
  case CollectiveOp::SendRecv:
    return "sendrecv";
  case CollectiveOp::Barrier:
    return "barrier";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& name) {
  if (name == "auto")
    return Algorithm::Auto;
  if (name == "ring")
    return Algorithm::Ring;
  if (name == "tree")
    return Algorithm::Tree;
  throw std::invalid_argument("unknown algorithm \"" + name + "\" (known: auto, ring, tree)");
}

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
  case Algorithm::Auto:
    return "auto";
  case Algorithm::Ring:
    return "ring";
  case Algorithm::Tree:
    return "tree";
  }
  return "?";
}

GroupShape group_shape(const std::vector<int>& global_ranks, const ClusterSpec& cluster) {
  if (global_ranks.empty())
    throw std::invalid_argument("group_shape: empty group");
  std::set<int> seen;
  std::vector<int> per_node(static_cast<size_t>(cluster.nodes), 0);
  for (int rank : global_ranks) {
    if (rank < 0 || rank >= cluster.world_size())
      throw std::invalid_argument("group_shape: rank " + std::to_string(rank) +
                                  " is outside the cluster of " +
                                  std::to_string(cluster.world_size()) + " GPUs");
    if (!seen.insert(rank).second)
      throw std::invalid_argument("group_shape: rank " + std::to_string(rank) + " listed twice");
    ++per_node[static_cast<size_t>(cluster.node_of(rank))];
  }
  GroupShape shape;
  shape.ranks = static_cast<int>(global_ranks.size());
  shape.nodes = static_cast<int>(
      std::count_if(per_node.begin(), per_node.end(), [](int count) { return count > 0; }));
  shape.ranks_per_node = *std::max_element(per_node.begin(), per_node.end());
  return shape;
}

double ring_all_reduce_time(int n, double bytes, const LinkSpec& link) {
  check(n, bytes);
  if (n == 1)
    return 0;
  return 2.0 * (n - 1) * alpha(link) + 2.0 * (n - 1) / n * bytes / beta(link);
}

double tree_all_reduce_time(int n, double bytes, const LinkSpec& link) {
  check(n, bytes);
  if (n == 1)
    return 0;
  return 2.0 * ceil_log2(n) * alpha(link) + 2.0 * bytes / beta(link);
}

double ring_all_gather_time(int n, double total_bytes, const LinkSpec& link) {
  check(n, total_bytes);
  if (n == 1)
    return 0;
  return (n - 1) * alpha(link) + static_cast<double>(n - 1) / n * total_bytes / beta(link);
}

double chain_broadcast_time(int n, double bytes, const LinkSpec& link) {
  check(n, bytes);
  if (n == 1)
    return 0;
  return (n - 1) * alpha(link) + bytes / beta(link);
}

double p2p_time(double bytes, const LinkSpec& link) {
  check(2, bytes);
  return alpha(link) + bytes / beta(link);
}

CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& s,
                               const LinkSpec& intra, const LinkSpec& inter, Algorithm algorithm) {
  check(s.ranks, bytes);
  if (s.nodes < 1 || s.ranks_per_node < 1 || s.nodes * s.ranks_per_node < s.ranks)
    throw std::invalid_argument("collective: inconsistent group shape (" + std::to_string(s.ranks) +
                                " ranks on " + std::to_string(s.nodes) + " nodes, at most " +
                                std::to_string(s.ranks_per_node) + " per node)");
  if (s.ranks == 1)
    return {0, Algorithm::Ring, false};
  const bool spans = s.nodes > 1;
  const int n = s.ranks;

  switch (op) {
  case CollectiveOp::Barrier: // a zero-byte all_reduce, as NCCL-based barriers are
    bytes = 0;
    [[fallthrough]];
  case CollectiveOp::AllReduce:
    return spans ? hierarchical_all_reduce(bytes, s, intra, inter, algorithm)
                 : pick_all_reduce(n, bytes, intra, algorithm);
  case CollectiveOp::AllGather:
  case CollectiveOp::ReduceScatter:
    return {spans ? hierarchical_all_gather(bytes, s, intra, inter)
                  : ring_all_gather_time(n, bytes, intra),
            Algorithm::Ring, spans};
  case CollectiveOp::Broadcast:
  case CollectiveOp::Reduce:
    return {spans ? hierarchical_chain(bytes, s, intra, inter)
                  : chain_broadcast_time(n, bytes, intra),
            Algorithm::Ring, spans};
  case CollectiveOp::SendRecv:
    if (n != 2)
      throw std::invalid_argument("sendrecv: group must be exactly {sender, receiver}");
    return {p2p_time(bytes, spans ? inter : intra), Algorithm::Ring, false};
  }
  throw std::invalid_argument("collective: unknown op");
}

CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& shape,
                               const ClusterSpec& cluster, Algorithm algorithm) {
  return collective_cost(op, bytes, shape, cluster.intra, cluster.inter, algorithm);
}

double bus_bandwidth_factor(CollectiveOp op, int n) {
  if (n < 1)
    throw std::invalid_argument("bus_bandwidth_factor: group size must be >= 1");
  switch (op) {
  case CollectiveOp::AllReduce:
  case CollectiveOp::Barrier:
    return 2.0 * (n - 1) / n;
  case CollectiveOp::AllGather:
  case CollectiveOp::ReduceScatter:
    return static_cast<double>(n - 1) / n;
  case CollectiveOp::Broadcast:
  case CollectiveOp::Reduce:
  case CollectiveOp::SendRecv:
    return 1.0;
  }
  return 1.0;
}

Bandwidths bandwidths(CollectiveOp op, int n, double bytes, double time_s) {
  if (time_s <= 0)
    throw std::invalid_argument("bandwidths: time must be > 0");
  Bandwidths bw;
  bw.algbw = bytes / time_s;
  bw.busbw = bw.algbw * bus_bandwidth_factor(op, n);
  return bw;
}

} // namespace meshsim
