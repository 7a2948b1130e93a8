// Collective cost model: the time of NCCL's collectives on a target cluster.
//
// Each collective is timed for every algorithm (ring, tree, NVLS) and protocol (LL, LL128,
// Simple) NCCL could use, as NCCL's own tuning model does (src/graph/tuning.cc), and the
// fastest is taken: latency = the protocol's base latency + hops x its per-hop latency on
// each kind of link; bandwidth = the link's achieved rate (LinkSpec::efficiency) x the share
// of each line the protocol spends on data. Groups spanning nodes run one ring through every
// member, bounded by the slower of NVLink and the node's share of NICs (ClusterSpec). The
// formulas are listed in docs/cost-model.md.
//
// Byte convention (the nccl-tests one): all_reduce/broadcast/reduce: the buffer size;
// all_gather: the total OUTPUT size (n shards); reduce_scatter: the total INPUT size (n
// shards); all_to_all: each rank's INPUT size (its share for itself included; even splits);
// send/recv: the message size.
//
// all_to_all is NCCL's grouped send/recv to every peer at once: no ring, each rank's bytes go
// straight to their destination, on NVLink inside a node and through ONE NIC per GPU across
// nodes (a GPU's peers are reached through its own rail; NCCL cannot spread one all-to-all over
// several NICs, nccl-tests #267). Uneven splits: all_to_all_cost(), set by the busiest rank.
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
  AllToAll,
  SendRecv,
  Barrier
};

/// Accepts the recorder's names: all_reduce, all_gather, reduce_scatter, broadcast, reduce,
/// all_to_all, send, recv, sendrecv, barrier.
CollectiveOp parse_collective_op(const std::string& name);
const char* to_string(CollectiveOp op);

/// Ring, Tree or Nvls pick the all_reduce algorithm; Auto picks whichever the model says is
/// faster. Nvls needs a single node whose NVSwitch reduces in the switch (LinkSpec::nvls).
enum class Algorithm { Auto, Ring, Tree, Nvls };
Algorithm parse_algorithm(const std::string& name); // "auto", "ring", "tree", "nvls"
const char* to_string(Algorithm algorithm);

/// NCCL's protocols: LL (8-byte lines, 4 of data and a 4-byte flag: lowest latency, half the
/// bandwidth), LL128 (128-byte lines, 120 of data), Simple (whole buffers, fences: the most
/// latency, all the bandwidth).
enum class Protocol { LL, LL128, Simple };
const char* to_string(Protocol protocol);
/// The share of the link's achieved bandwidth a protocol carries as data: 0.5, 120/128, 1.
double protocol_share(Protocol protocol);

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
  Protocol protocol = Protocol::Simple;
  bool hierarchical = false; // true when the group spans nodes
};

/// Per-hop latency of `algorithm` with `protocol` on a link of `kind`, and the fixed latency
/// of one call, in seconds: NCCL's tuning constants (docs/cost-model.md).
double hop_latency(LinkKind kind, Algorithm algorithm, Protocol protocol);
double base_latency(Algorithm algorithm, Protocol protocol);

/// Time of one collective on a group of the given shape, with one algorithm and protocol
/// (`algorithm` Auto and the protocol: the fastest algorithm for that protocol), or with the
/// fastest of all when `protocol` is not given. std::invalid_argument when the algorithm
/// cannot run the op on that shape (Tree for anything but all_reduce, Nvls off an NVLS switch).
CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& shape,
                               const ClusterSpec& cluster, Algorithm algorithm = Algorithm::Auto);
CollectiveCost collective_cost(CollectiveOp op, double bytes, const GroupShape& shape,
                               const ClusterSpec& cluster, Algorithm algorithm, Protocol protocol);

/// all_to_all with per-pair bytes: bytes[i][j] is what group member i sends member j (group
/// order; the diagonal stays local). Each member sends and receives at once over full-duplex
/// links: its time is the longer of its NVLink traffic (to or from peers on its node) at the
/// intra link's achieved rate and its network traffic at one NIC's share (inter_per_gpu),
/// whichever direction is heavier; the busiest member sets the collective's time, plus one
/// send/recv step's latency (the network's hop when the group spans nodes). With every row an
/// even split of B on a group with the same number of members per node, this is
/// collective_cost(AllToAll, B, ...). std::invalid_argument for a matrix that is not
/// group-sized and square, or a negative entry.
CollectiveCost all_to_all_cost(const std::vector<std::vector<double>>& bytes,
                               const std::vector<int>& global_ranks, const ClusterSpec& cluster);

/// The same cluster with every link at its line rate (efficiency 1): what `bench comm` prints
/// beside the achieved model.
ClusterSpec at_line_rate(ClusterSpec cluster);

/// nccl-tests bus-bandwidth factor: 2(n-1)/n all_reduce, (n-1)/n all_gather/reduce_scatter/
/// all_to_all, 1 broadcast/reduce/sendrecv.
double bus_bandwidth_factor(CollectiveOp op, int n);

struct Bandwidths {
  double algbw = 0; // bytes / time
  double busbw = 0; // algbw * bus_bandwidth_factor
};
Bandwidths bandwidths(CollectiveOp op, int n, double bytes, double time_s);

} // namespace meshsim
