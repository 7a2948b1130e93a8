// Communicator: the collectives every strategy is written against.
//
// One Communicator per rank. Every call is recorded (op, group, bytes, time). Collectives on a
// group must be called by every member in the same order; a member that never arrives is
// reported by a CollectiveTimeout naming the op, its sequence number and the missing ranks.
//
// The *_async calls start a collective and return its Work at once, as c10d's do: the
// tensors belong to the backend until Work::wait() returns, and the caller computes
// meanwhile (DDP's buckets, parallel/data/buckets.h). A backend runs a rank's collectives in the
// order they were called, blocking or not; isend/irecv are the messages' asynchronous forms.
//
// all_to_all is all_to_all_single: rows of dim 0 go to the members in group order, each member
// with its own split sizes (MoE's token exchange, context parallelism's head scatter).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "comm/recorder.h"

namespace meshsim {

enum class ReduceOp { Sum, Avg, Max };

/// Point-to-point tags from here up mark a ring's exchange: every member of a group sends a
/// message to its next and receives one of the same shape from its previous (context
/// parallelism's K/V ring). A plan runs one member of such a group, so the record-only
/// backend records these messages without a peer; every other backend sends them as usual.
constexpr int kSymmetricTagBase = 1 << 29;

/// Where a rank `self`'s point-to-point message for `peer` is delivered, in a plan whose
/// peer does not run (plan/stage_images.h); the records still name `peer`.
using P2pRoute = std::function<int(int self, int peer)>;

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
/// std::invalid_argument in one line unless `output` can take all_gather of `input` over
/// `members` ranks (members × its elements, its dtype): what every all_gather_async checks.
void check_all_gather_output(const torch::Tensor& input, const torch::Tensor& output, int members);
/// reduce_scatter's output for `input` over `members` ranks, [numel / members], charged as
/// communication; throws std::invalid_argument when the input does not split evenly.
torch::Tensor reduce_scatter_output(const torch::Tensor& input, int members);

/// all_to_all's split sizes in rows of dim 0, one per member in group order, resolved: an
/// empty vector is an equal split of the input's rows (input) or of as many rows as the input
/// has (output). std::invalid_argument in one line for a 0-d input, a count that is not
/// `members`, a negative size, input sizes that do not add up to dim 0, or rows that do not
/// split evenly.
struct AllToAllSplits {
  std::vector<int64_t> input;   // rows sent to each member
  std::vector<int64_t> output;  // rows received from each member
  int64_t row_numel = 1;        // elements per row (the product of the other dims)
  int64_t output_rows() const;
};
AllToAllSplits all_to_all_splits(const torch::Tensor& input,
                                 const std::vector<int64_t>& output_split_sizes,
                                 const std::vector<int64_t>& input_split_sizes, int members);
/// all_to_all's output, [splits.output_rows(), *input.sizes()[1:]], charged as communication.
torch::Tensor all_to_all_output(const torch::Tensor& input, const AllToAllSplits& splits);
/// Bytes sent to each member: what CollectiveRecord::peer_bytes keeps.
std::vector<int64_t> all_to_all_peer_bytes(const torch::Tensor& input,
                                           const AllToAllSplits& splits);

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
  /// Rows of `input` (dim 0) scattered to the members: input_split_sizes[j] rows to member j,
  /// in order; returns output_split_sizes[j] rows from each member j, in member order (the
  /// other dims as the input's). Empty sizes: equal splits (dim 0 divisible by group.size()).
  /// Splits that do not add up, or that disagree with a peer's, are refused in one line.
  virtual torch::Tensor all_to_all(const torch::Tensor& input,
                                   const std::vector<int64_t>& output_split_sizes,
                                   const std::vector<int64_t>& input_split_sizes,
                                   const Group& group) = 0;

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

  /// Starts all_gather of `input` (contiguous) into `output` ([group.size(), *input.sizes()],
  /// contiguous): member i's input at index i. `input` may be this member's own slot of
  /// `output` (in place, as NCCL allows). The default runs it now.
  virtual std::unique_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor output,
                                                 const Group& group) {
    output.copy_(all_gather(input, group));
    return std::make_unique<CompletedWork>();
  }

  /// Starts a send of `tensor`: the message is the backend's copy, so the tensor is the
  /// caller's again at once; wait() returns once it is queued for (or delivered to) `dst`.
  /// Recorded as send. The default sends now.
  virtual std::unique_ptr<Work> isend(const torch::Tensor& tensor, int dst, int tag = 0) {
    send(tensor, dst, tag);
    return std::make_unique<CompletedWork>();
  }
  /// Starts receiving the message from `src` into `output` (contiguous), which must have the
  /// message's dtype and number of elements; it is the backend's until wait(). Recorded as
  /// recv. The default receives now.
  virtual std::unique_ptr<Work> irecv(torch::Tensor output, int src, int tag = 0) {
    torch::Tensor got = recv(src, tag);
    check_irecv_fits(output, got, src);
    output.copy_(got.view_as(output));
    return std::make_unique<CompletedWork>();
  }

  /// The calls made so far by this rank.
  virtual const std::vector<CollectiveRecord>& records() const = 0;

  // Whole-world conveniences.
  void all_reduce(torch::Tensor& t, ReduceOp op) { all_reduce(t, op, Group::world(world_size())); }
  void broadcast(torch::Tensor& t, int root) { broadcast(t, root, Group::world(world_size())); }
  void barrier() { barrier(Group::world(world_size())); }

protected:
  /// std::invalid_argument when the message `got` from `src` does not fit irecv's `output`.
  static void check_irecv_fits(const torch::Tensor& output, const torch::Tensor& got, int src);
};

} // namespace meshsim
