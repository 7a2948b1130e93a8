// Collective cost model: α–β time of NCCL-style collectives on a target cluster.
//
// α is the per-hop latency and β the per-GPU, per-direction bandwidth of a LinkSpec. The
// per-algorithm formulas follow NCCL's own tuning model (src/graph/tuning.cc): ring steps,
// double-binary-tree depth, pipelined chains. Groups spanning nodes are modelled
// hierarchically. docs/cost-model.md lists every formula.
//
// Byte convention (the nccl-tests one): all_reduce/broadcast/reduce: the buffer size;
// all_gather: the total OUTPUT size (n shards); reduce_scatter: the total INPUT size (n
// shards); send/recv: the message size.
#pragma once

#include <string>
#include <vector>

#include "cost/hardware.h"

namespace meshsim {

enum class CollectiveOp {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  Reduce,
  SendRecv,
  Barrier
};

/// Accepts the recorder's names: all_reduce, all_gather, reduce_scatter, broadcast, reduce,
/// send, recv, sendrecv, barrier.
CollectiveOp parse_collective_op(const std::string& name);
const char* to_string(CollectiveOp op);

/// Ring or Tree pick the algorithm (for groups spanning nodes: of the inter-node stage);
/// Auto picks whichever the model says is faster. Only all_reduce has a tree variant, as in NCCL.
enum class Algorithm { Auto, Ring, Tree };
Algorithm parse_algorithm(const std::string& name); // "auto", "ring", "tree"
const char* to_string(Algorithm algorithm);

/// How a group lies on the cluster. `ranks_per_node` is the most members any one node holds
/// (the busiest node bounds the intra-node stages when a group is uneven).
struct GroupShape {
  int ranks = 1;
  int nodes = 1;
  int ranks_per_node = 1;

  static GroupShape within_node(int ranks) { return {ranks, 1, ranks}; }
  static GroupShape across(int nodes, int per_node) { return {nodes * per_node, nodes, per_node}; }
};

/// Shape of a group of global ranks (rank r on node r / gpus_per_node). Throws
/// std::invalid_argument for an empty group, duplicates, or ranks outside the cluster.
GroupShape group_shape(const std::vector<int>& global_ranks, const ClusterSpec& cluster);

struct CollectiveCost {
  double time_s = 0;
  Algorithm algorithm = Algorithm::Ring; // never Auto: what was picked
  bool hierarchical = false;             // true when the group spans nodes
};

// Single-link building blocks, n ranks on one kind of link.
/// 2(n-1)·α + 2(n-1)/n · B/β
double ring_all_reduce_time(int n, double bytes, const LinkSpec& link);
/// 2·ceil(log2 n)·α + 2·B/β (pipelined double binary tree: each rank sends and receives the
/// whole buffer once going up and once coming down).
double tree_all_reduce_time(int n, double bytes, const LinkSpec& link);
/// (n-1)·α + (n-1)/n · B/β with B the total size; all_gather and reduce_scatter alike.
double ring_all_gather_time(int n, double total_bytes, const LinkSpec& link);
/// (n-1)·α + B/β: a chain pipelined in small chunks; broadcast and reduce alike.
double chain_broadcast_time(int n, double bytes, const LinkSpec& link);
/// α + B/β
double p2p_time(double bytes, const LinkSpec& link);

/// Time of one collective on a group of the given shape. `intra` serves groups inside a node,
/// `inter` the node-to-node stages (one NIC per GPU, so a node drives ranks_per_node NICs).
CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& shape,
                               const LinkSpec& intra, const LinkSpec& inter,
                               Algorithm algorithm = Algorithm::Auto);
CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& shape,
                               const ClusterSpec& cluster, Algorithm algorithm = Algorithm::Auto);

/// nccl-tests bus-bandwidth factor: 2(n-1)/n all_reduce, (n-1)/n all_gather/reduce_scatter,
/// 1 broadcast/reduce/sendrecv.
double bus_bandwidth_factor(CollectiveOp op, int n);

struct Bandwidths {
  double algbw = 0; // bytes / time
  double busbw = 0; // algbw * bus_bandwidth_factor
};
Bandwidths bandwidths(CollectiveOp op, int n, double bytes, double time_s);

} // namespace meshsim
