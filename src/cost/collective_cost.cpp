// Collective cost model: NCCL's algorithms and protocols timed with its own latency constants
// and the links' achieved bandwidths. See collective_cost.h and docs/cost-model.md.
#include "cost/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace meshsim {
namespace {

constexpr double kMicro = 1e-6;

// NCCL's tuning model (src/graph/tuning.cc, 2.18 to 2.21), microseconds. Base latency of a
// call, per algorithm { LL, LL128, Simple }; NVLS has none but a larger per-hop latency.
constexpr double kBaseRing[3] = {6.6, 14.0, 8.4};
constexpr double kBaseTree[3] = {6.8, 14.0, 8.4};
// Per hop, per link kind { NVLink, PCIe, network }, per algorithm { LL, LL128, Simple }.
constexpr double kHopRing[3][3] = {{0.6, 1.9, 3.4}, {1.0, 2.5, 5.7}, {2.7, 4.0, 14.0}};
constexpr double kHopTree[3][3] = {{0.6, 1.25, 4.0}, {1.0, 1.9, 4.0}, {5.0, 8.5, 14.0}};
constexpr double kHopNvls = 25.0; // NVLS, Simple only

constexpr Protocol kProtocols[] = {Protocol::LL, Protocol::LL128, Protocol::Simple};

int ceil_log2(int n) {
  int depth = 0;
  while ((1 << depth) < n)
    ++depth;
  return depth;
}

void check_bytes(double bytes) {
  if (bytes < 0)
    throw std::invalid_argument("collective: negative byte count");
}

// The terms of one algorithm on one shape: hops on each kind of link, and the bytes each rank
// moves over the narrowest link it crosses, at that link's achieved bandwidth.
struct Terms {
  double intra_hops = 0;
  double inter_hops = 0;
  double bytes_per_rank = 0;
  double bandwidth = 0; // bytes/s, before the protocol's share
};

// One ring through every member: inside a node it runs on NVLink (or PCIe); between nodes each
// of the node's g members drives its share of the NICs, so the ring's rate is the slower of the
// intra link and g NIC shares. `steps` ring steps, `crossings` of them leave a node.
Terms ring_terms(double steps, double crossings, double bytes_per_rank, const GroupShape& s,
                 const ClusterSpec& c) {
  Terms t;
  t.inter_hops = s.nodes > 1 ? crossings : 0;
  t.intra_hops = std::max(0.0, steps - t.inter_hops);
  t.bytes_per_rank = bytes_per_rank;
  t.bandwidth = s.nodes > 1 ? std::min(c.intra.achieved(), s.ranks_per_node * c.inter_per_gpu())
                            : c.intra.achieved();
  return t;
}

double time_of(const Terms& t, double base, double intra_hop, double inter_hop, double share) {
  if (t.bandwidth <= 0)
    throw std::invalid_argument("collective: a link has no bandwidth");
  return base + t.intra_hops * intra_hop + t.inter_hops * inter_hop +
         t.bytes_per_rank / (share * t.bandwidth);
}

int kind_index(LinkKind kind) {
  return kind == LinkKind::NVLink ? 0 : kind == LinkKind::PCIe ? 1 : 2;
}

// all_to_all: the busiest member moves `intra` bytes over NVLink and `inter` through its NIC
// (the heavier direction of each), both at once; one send/recv step's latency.
double all_to_all_time(double intra, double inter, const GroupShape& s, const ClusterSpec& c,
                       Protocol protocol) {
  const double share = protocol_share(protocol);
  const LinkKind hop = s.nodes > 1 ? LinkKind::Network : c.intra.kind;
  if (c.intra.achieved() <= 0 || (s.nodes > 1 && c.inter_per_gpu() <= 0))
    throw std::invalid_argument("collective: a link has no bandwidth");
  double t = intra / (share * c.intra.achieved());
  if (s.nodes > 1)
    t = std::max(t, inter / (share * c.inter_per_gpu()));
  return base_latency(Algorithm::Ring, protocol) + hop_latency(hop, Algorithm::Ring, protocol) + t;
}

bool nvls_possible(CollectiveOp op, const GroupShape& s, const ClusterSpec& c) {
  return (op == CollectiveOp::AllReduce || op == CollectiveOp::Barrier) && s.nodes == 1 &&
         c.intra.nvls_efficiency > 0;
}

// One algorithm with one protocol; +inf when that pair cannot run the op.
double algorithm_time(CollectiveOp op, double bytes, const GroupShape& s, const ClusterSpec& c,
                      Algorithm algorithm, Protocol protocol) {
  const double n = s.ranks, nodes = s.nodes;
  const double share = protocol_share(protocol);
  const double intra_hop = hop_latency(c.intra.kind, algorithm, protocol);
  const double inter_hop = hop_latency(LinkKind::Network, algorithm, protocol);
  const double base = base_latency(algorithm, protocol);
  const bool all_reduce = op == CollectiveOp::AllReduce || op == CollectiveOp::Barrier;

  if (algorithm == Algorithm::Nvls) {
    if (!nvls_possible(op, s, c) || protocol != Protocol::Simple)
      return std::numeric_limits<double>::infinity();
    // Every rank pushes its buffer to the switch and pulls the reduced one back: B each way,
    // whatever n, at the NVLS share of the line rate.
    return base + intra_hop + bytes / (c.intra.nvls_efficiency * c.intra.bandwidth);
  }
  if (algorithm == Algorithm::Tree) {
    if (!all_reduce)
      return std::numeric_limits<double>::infinity();
    // A chain inside each node, a double binary tree between nodes (NCCL's tree): up and
    // down once, each rank moving the whole buffer both ways.
    Terms t = ring_terms(0, 0, 2 * bytes, s, c);
    t.intra_hops = 2.0 * (s.ranks_per_node - 1);
    t.inter_hops = 2.0 * ceil_log2(s.nodes);
    return time_of(t, base, intra_hop, inter_hop, share);
  }
  switch (op) {
  case CollectiveOp::Barrier:
  case CollectiveOp::AllReduce: // reduce-scatter then all-gather around the ring
    return time_of(ring_terms(2 * (n - 1), 2 * nodes, 2 * (n - 1) / n * bytes, s, c), base,
                   intra_hop, inter_hop, share);
  case CollectiveOp::AllGather:
  case CollectiveOp::ReduceScatter:
    return time_of(ring_terms(n - 1, nodes, (n - 1) / n * bytes, s, c), base, intra_hop,
                   inter_hop, share);
  case CollectiveOp::Broadcast:
  case CollectiveOp::Reduce: // a chain pipelined in small chunks
    return time_of(ring_terms(n - 1, nodes - 1, bytes, s, c), base, intra_hop, inter_hop, share);
  case CollectiveOp::AllToAll: // B/n to every peer: g-1 of them on its node, n-g elsewhere
    return all_to_all_time((s.ranks_per_node - 1) / n * bytes, (n - s.ranks_per_node) / n * bytes,
                           s, c, protocol);
  case CollectiveOp::SendRecv: {
    Terms t = ring_terms(1, 1, bytes, s, c);
    if (s.nodes > 1)
      t.bandwidth = c.inter_per_gpu(); // one rank's share of its node's NICs
    return time_of(t, base, intra_hop, inter_hop, share);
  }
  }
  throw std::invalid_argument("collective: unknown op");
}

// Inside one node NCCL's tree is a chain with the ring's hop count and twice its traffic, so
// Auto offers it to groups spanning nodes only.
std::vector<Algorithm> candidates(CollectiveOp op, const GroupShape& s, Algorithm algorithm) {
  if (algorithm != Algorithm::Auto)
    return {algorithm};
  if (op != CollectiveOp::AllReduce && op != CollectiveOp::Barrier)
    return {Algorithm::Ring};
  if (s.nodes > 1)
    return {Algorithm::Ring, Algorithm::Tree};
  return {Algorithm::Ring, Algorithm::Nvls};
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
  if (name == "all_to_all" || name == "alltoall")
    return CollectiveOp::AllToAll;
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
  case CollectiveOp::AllToAll:
    return "all_to_all";
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
  if (name == "nvls")
    return Algorithm::Nvls;
  throw std::invalid_argument("unknown algorithm \"" + name + "\" (known: auto, ring, tree, nvls)");
}

const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
  case Algorithm::Auto:
    return "auto";
  case Algorithm::Ring:
    return "ring";
  case Algorithm::Tree:
    return "tree";
  case Algorithm::Nvls:
    return "nvls";
  }
  return "?";
}

GroupShape group_shape(const std::vector<int>& global_ranks, const ClusterSpec& cluster) {
  if (global_ranks.empty())
    throw std::invalid_argument("group_shape: empty group");
  // Sorted copies, not a count per node: a plan replays many small groups on clusters of
  // thousands of nodes.
  std::vector<int> ranks = global_ranks;
  std::sort(ranks.begin(), ranks.end());
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int rank = ranks[i];
    if (rank < 0 || rank >= cluster.world_size())
      throw std::invalid_argument("group_shape: rank " + std::to_string(rank) +
                                  " is outside the cluster of " +
                                  std::to_string(cluster.world_size()) + " GPUs");
    if (i > 0 && ranks[i - 1] == rank)
      throw std::invalid_argument("group_shape: rank " + std::to_string(rank) + " listed twice");
    nodes.push_back(cluster.node_of(rank)); // ascending, as the ranks are
  }
  GroupShape shape;
  shape.ranks = static_cast<int>(global_ranks.size());
  shape.nodes = shape.ranks_per_node = 0;
  for (size_t i = 0, run = 0; i < nodes.size(); ++i) {
    run = i > 0 && nodes[i] == nodes[i - 1] ? run + 1 : 1;
    shape.nodes += run == 1;
    shape.ranks_per_node = std::max(shape.ranks_per_node, static_cast<int>(run));
  }
  return shape;
}

double protocol_share(Protocol protocol) {
  switch (protocol) {
  case Protocol::LL:
    return 0.5;
  case Protocol::LL128:
    return 120.0 / 128.0;
  case Protocol::Simple:
    return 1.0;
  }
  return 1.0;
}

const char* to_string(Protocol protocol) {
  switch (protocol) {
  case Protocol::LL:
    return "LL";
  case Protocol::LL128:
    return "LL128";
  case Protocol::Simple:
    return "Simple";
  }
  return "?";
}

double hop_latency(LinkKind kind, Algorithm algorithm, Protocol protocol) {
  const int p = static_cast<int>(protocol);
  if (algorithm == Algorithm::Nvls)
    return kHopNvls * kMicro;
  const auto& table = algorithm == Algorithm::Tree ? kHopTree : kHopRing;
  return table[kind_index(kind)][p] * kMicro;
}

double base_latency(Algorithm algorithm, Protocol protocol) {
  const int p = static_cast<int>(protocol);
  if (algorithm == Algorithm::Nvls)
    return 0;
  return (algorithm == Algorithm::Tree ? kBaseTree[p] : kBaseRing[p]) * kMicro;
}

CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& s,
                               const ClusterSpec& cluster, Algorithm algorithm,
                               Protocol protocol) {
  check_bytes(bytes);
  if (s.ranks < 1 || s.nodes < 1 || s.ranks_per_node < 1 || s.nodes * s.ranks_per_node < s.ranks)
    throw std::invalid_argument("collective: inconsistent group shape (" + std::to_string(s.ranks) +
                                " ranks on " + std::to_string(s.nodes) + " nodes, at most " +
                                std::to_string(s.ranks_per_node) + " per node)");
  if (op == CollectiveOp::SendRecv && s.ranks != 2)
    throw std::invalid_argument("sendrecv: group must be exactly {sender, receiver}");
  if (algorithm == Algorithm::Tree && op != CollectiveOp::AllReduce && op != CollectiveOp::Barrier)
    throw std::invalid_argument(std::string("collective: the tree algorithm runs all_reduce only, "
                                            "not ") + to_string(op));
  if (algorithm == Algorithm::Nvls && !nvls_possible(op, s, cluster))
    throw std::invalid_argument("collective: NVLS runs all_reduce only, inside one node whose "
                                "NVSwitch reduces (nvlink4, nvlink4-h800, nvlink5); asked for " +
                                std::string(to_string(op)) + " over " + std::to_string(s.nodes) +
                                " node(s) of " + cluster.intra.name);
  if (s.ranks == 1)
    return {0, algorithm == Algorithm::Auto ? Algorithm::Ring : algorithm, protocol, false};
  if (op == CollectiveOp::Barrier)
    bytes = 0; // a zero-byte all_reduce, as NCCL-based barriers are
  CollectiveCost best{std::numeric_limits<double>::infinity(), Algorithm::Ring, protocol,
                      s.nodes > 1};
  for (Algorithm a : candidates(op, s, algorithm)) {
    const double t = algorithm_time(op, bytes, s, cluster, a, protocol);
    if (t < best.time_s) {
      best.time_s = t;
      best.algorithm = a;
    }
  }
  return best;
}

CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& shape,
                               const ClusterSpec& cluster, Algorithm algorithm) {
  if (op != CollectiveOp::AllReduce && op != CollectiveOp::Barrier)
    algorithm = Algorithm::Auto; // the choice is all_reduce's; other ops have one algorithm
  CollectiveCost best;
  best.time_s = std::numeric_limits<double>::infinity();
  for (Protocol p : kProtocols) {
    if (algorithm == Algorithm::Nvls && p != Protocol::Simple)
      continue;
    const CollectiveCost cost = collective_cost(op, bytes, shape, cluster, algorithm, p);
    if (cost.time_s < best.time_s)
      best = cost;
  }
  return best;
}

CollectiveCost all_to_all_cost(const std::vector<std::vector<double>>& bytes,
                               const std::vector<int>& global_ranks, const ClusterSpec& cluster) {
  const GroupShape shape = group_shape(global_ranks, cluster);
  const size_t n = global_ranks.size();
  if (bytes.size() != n)
    throw std::invalid_argument("all_to_all: " + std::to_string(bytes.size()) +
                                " rows of bytes for a group of " + std::to_string(n));
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i].size() != n)
      throw std::invalid_argument("all_to_all: member " + std::to_string(i) + " has " +
                                  std::to_string(bytes[i].size()) + " byte counts for a group of " +
                                  std::to_string(n));
    for (double b : bytes[i])
      check_bytes(b);
  }
  // Each member's traffic on its node (NVLink) and off it (its NIC), the heavier direction.
  double intra = 0, inter = 0;
  for (size_t i = 0; i < n; ++i) {
    double sent[2] = {0, 0}, received[2] = {0, 0}; // { intra, inter }
    for (size_t j = 0; j < n; ++j) {
      if (i == j)
        continue;
      const int off = cluster.node_of(global_ranks[i]) != cluster.node_of(global_ranks[j]);
      sent[off] += bytes[i][j];
      received[off] += bytes[j][i];
    }
    intra = std::max({intra, sent[0], received[0]});
    inter = std::max({inter, sent[1], received[1]});
  }
  CollectiveCost best{std::numeric_limits<double>::infinity(), Algorithm::Ring, Protocol::Simple,
                      shape.nodes > 1};
  if (n == 1)
    return {0, Algorithm::Ring, Protocol::Simple, false};
  for (Protocol p : kProtocols) {
    const double t = all_to_all_time(intra, inter, shape, cluster, p);
    if (t < best.time_s) {
      best.time_s = t;
      best.protocol = p;
    }
  }
  return best;
}

ClusterSpec at_line_rate(ClusterSpec cluster) {
  cluster.intra.efficiency = 1;
  cluster.inter.efficiency = 1;
  if (cluster.intra.nvls_efficiency > 0)
    cluster.intra.nvls_efficiency = 1;
  return cluster;
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
  case CollectiveOp::AllToAll:
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
