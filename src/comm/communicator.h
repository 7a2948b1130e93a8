// Communicator: the collectives every strategy is written against.
//
// One Communicator per rank. Every call is recorded (op, group, bytes, time). Collectives on a
// group must be called by every member in the same order; a member that never arrives is
// reported by a CollectiveTimeout naming the op, its sequence number and the missing ranks.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mesh/recorder.h"

namespace meshsim {

enum class ReduceOp { Sum, Avg, Max };

/// A set of global ranks. The order is the group order (index = "group rank").
struct Group {
  std::vector<int> ranks;
  int size() const { return static_cast<int>(ranks.size()); }
  int index_of(int rank) const;  // -1 if not a member
  std::string key() const;       // "0,1,2,3"
  static Group world(int n);
};

/// A collective did not complete in time: some ranks never arrived.
class CollectiveTimeout : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Raised in ranks that were waiting when another rank failed; the other rank's error is the
/// one the run reports.
class RankAborted : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Ranks called different collectives (or sizes) at the same point of a group's sequence.
class CollectiveMismatch : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  /// In place: every member ends with the reduction of all members' tensors.
  virtual void all_reduce(torch::Tensor& tensor, ReduceOp op, const Group& group) = 0;
  /// In place: every member ends with root's tensor (root is a global rank).
  virtual void broadcast(torch::Tensor& tensor, int root, const Group& group) = 0;
  /// Returns [group.size(), *input.sizes()]: member i's input at index i.
  virtual torch::Tensor all_gather(const torch::Tensor& input, const Group& group) = 0;
  /// input has group.size() * k elements; returns member i's k-element reduced chunk.
  virtual torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op,
                                       const Group& group) = 0;
  /// In place on root (a global rank); other members' tensors are left unchanged.
  virtual void reduce(torch::Tensor& tensor, int root, ReduceOp op, const Group& group) = 0;
  /// Buffered: returns once the message is queued for `dst`.
  virtual void send(const torch::Tensor& tensor, int dst, int tag = 0) = 0;
  /// Blocks until the matching send arrives; returns a tensor on the caller's GPU.
  virtual torch::Tensor recv(int src, int tag = 0) = 0;
  virtual void barrier(const Group& group) = 0;

  /// The calls made so far by this rank.
  virtual const std::vector<CollectiveRecord>& records() const = 0;

  // Whole-world conveniences.
  void all_reduce(torch::Tensor& t, ReduceOp op) { all_reduce(t, op, Group::world(world_size())); }
  void broadcast(torch::Tensor& t, int root) { broadcast(t, root, Group::world(world_size())); }
  void barrier() { barrier(Group::world(world_size())); }
};

} // namespace meshsim
