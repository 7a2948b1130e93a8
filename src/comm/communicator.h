// Communicator: the collectives every strategy is written against.
//
// One Communicator per rank. Every call is recorded (op, group, bytes, time). Collectives on a
// group must be called by every member in the same order; a member that never arrives is
// reported by a CollectiveTimeout naming the op, its sequence number and the missing ranks.
//
// The *_async calls start a collective and return its Work at once, as c10d's do: the
// tensors belong to the backend until Work::wait() returns, and the caller computes
// meanwhile (DDP's buckets, parallel/data/buckets.h). A backend runs a rank's collectives in the
// order they were called, blocking or not.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "comm/recorder.h"

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

/// all_gather's output for `input` over `members` ranks, [members, *input.sizes()], charged
/// to the caller's GPU as communication: what every backend allocates.
torch::Tensor all_gather_output(const torch::Tensor& input, int members);
/// reduce_scatter's output for `input` over `members` ranks, [numel / members], charged as
/// communication; throws std::invalid_argument when the input does not split evenly.
torch::Tensor reduce_scatter_output(const torch::Tensor& input, int members);

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

/// A collective in flight. wait() returns once its tensors are the caller's again, and
/// rethrows its failure (CollectiveTimeout, RankAborted, CollectiveMismatch). A Work that
/// is never waited on (a rank unwinding from a failure) drops its failure; its tensors stay
/// alive until the collective has ended.
class Work {
public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

/// A Work already complete: what a backend that runs every collective on the calling
/// thread returns.
class CompletedWork final : public Work {
public:
  void wait() override {}
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

  /// Starts an in-place all-reduce of `tensor` (contiguous). The default runs it now.
  virtual std::unique_ptr<Work> all_reduce_async(torch::Tensor tensor, ReduceOp op,
                                                 const Group& group) {
    all_reduce(tensor, op, group);
    return std::make_unique<CompletedWork>();
  }
  /// Starts reduce_scatter of `input` into `output` (this member's chunk, contiguous). The
  /// default runs it now.
  virtual std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& input,
                                                     torch::Tensor output, ReduceOp op,
                                                     const Group& group) {
    output.copy_(reduce_scatter(input, op, group));
    return std::make_unique<CompletedWork>();
  }

  /// The calls made so far by this rank.
  virtual const std::vector<CollectiveRecord>& records() const = 0;

  // Whole-world conveniences.
  void all_reduce(torch::Tensor& t, ReduceOp op) { all_reduce(t, op, Group::world(world_size())); }
  void broadcast(torch::Tensor& t, int root) { broadcast(t, root, Group::world(world_size())); }
  void barrier() { barrier(Group::world(world_size())); }
};

} // namespace meshsim
