// SimCommunicator: one rank's end of the in-process backend (sim_backend.h), internal to comm/.
//
// Its collectives are rendezvous on SimWorld (sim_backend.cpp); its messages go through
// SimWorld's mailboxes (sim_messages.cpp). Every operation is recorded, then run on the rank's
// communication thread (comm_thread.h), or on the rank's own thread on a CUDA card, where the
// rank's stream orders the work.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_thread.h"
#include "comm/communicator.h"
#include "comm/sim_backend.h"

namespace meshsim {

class SimCommunicator;

// A collective or message of SimCommunicator in flight (communicator.h's Work).
class SimWork final : public Work {
public:
  SimWork(SimCommunicator& comm, std::shared_ptr<CommOp> op, size_t record, bool async,
          bool ran_inline, std::function<void()> finish)
      : comm_(comm), op_(std::move(op)), record_(record), async_(async), inline_(ran_inline),
        finish_(std::move(finish)) {}
  void wait() override;

private:
  SimCommunicator& comm_;
  std::shared_ptr<CommOp> op_;
  size_t record_;  // in comm_'s records
  bool async_;
  bool inline_;  // ran on the rank's thread (a CUDA card): done already
  std::function<void()> finish_;  // on the rank's thread once the data has moved
  bool waited_ = false;
};

class SimCommunicator final : public Communicator {
public:
  SimCommunicator(SimWorld& world, int rank) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_.world_size(); }
  const std::vector<CollectiveRecord>& records() const override { return records_; }

  void all_reduce(torch::Tensor& tensor, ReduceOp op, const Group& group) override;
  std::unique_ptr<Work> all_reduce_async(torch::Tensor tensor, ReduceOp op,
                                         const Group& group) override;
  void broadcast(torch::Tensor& tensor, int root, const Group& group) override;
  torch::Tensor all_gather(const torch::Tensor& input, const Group& group) override;
  torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op,
                               const Group& group) override;
  std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor output,
                                             ReduceOp op, const Group& group) override;
  std::unique_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor output,
                                         const Group& group) override;
  void reduce(torch::Tensor& tensor, int root, ReduceOp op, const Group& group) override;
  torch::Tensor all_to_all(const torch::Tensor& input,
                           const std::vector<int64_t>& output_split_sizes,
                           const std::vector<int64_t>& input_split_sizes,
                           const Group& group) override;
  void barrier(const Group& group) override;

  // sim_messages.cpp
  void send(const torch::Tensor& tensor, int dst, int tag) override;
  torch::Tensor recv(int src, int tag) override;
  std::unique_ptr<Work> isend(const torch::Tensor& tensor, int dst, int tag) override;
  std::unique_ptr<Work> irecv(torch::Tensor output, int src, int tag) override;

private:
  friend class SimWork;

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& buf, ReduceOp op,
                                         const Group& group, bool async);
  std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& in, const torch::Tensor& out,
                                             ReduceOp op, const Group& group, bool async);
  std::unique_ptr<Work> all_gather_async(const torch::Tensor& in, const torch::Tensor& out,
                                         const Group& group, bool async);
  // A message to `dst`, or one from `src` into `*into` (allocated at wait() when undefined).
  std::unique_ptr<Work> post_send(const torch::Tensor& tensor, int dst, int tag, bool async);
  std::unique_ptr<Work> post_recv(int src, int tag, bool async,
                                  std::shared_ptr<torch::Tensor> into);

  static torch::Tensor contiguous(torch::Tensor& t) {
    return t.is_contiguous() ? t : t.contiguous();
  }
  static void check_contiguous(const torch::Tensor& t, const char* what);
  int checked_member(const Group& group, int rank, const char* what) const;
  void check_peer(int peer, const char* op) const;
  CollectiveRecord start_record(const char* op, std::vector<int> group, const torch::Tensor& t);
  const RunClock& clock() const { return world_.clock_ ? *world_.clock_ : world_.own_clock_; }

  // Records `rec` and runs `op`: on the communication thread (started at the first call), or
  // here on a CUDA card, where the rank's stream orders the work.
  std::unique_ptr<Work> submit(CollectiveRecord rec, std::shared_ptr<CommOp> op, bool async,
                               std::function<void()> finish, bool on_card = false);

  // The rendezvous shared by every collective: arrive, do this member's slice, depart.
  // `keep` are the buffers behind `arrival.in` and `arrival.out`.
  std::unique_ptr<Work> collective(SimWorld::Arrival arrival, const Group& group,
                                   const torch::Tensor& meta, std::vector<torch::Tensor> keep,
                                   bool async, std::function<void(SimWorld::Slot&, int)> work);
  std::unique_ptr<Work> collective(const char* op, const Group& group, const torch::Tensor& meta,
                                   void* in, void* out, int root, std::vector<torch::Tensor> keep,
                                   bool async, std::function<void(SimWorld::Slot&, int)> work);

  SimWorld& world_;
  const int rank_;
  std::map<std::string, int64_t> seq_;
  std::map<std::pair<int, int>, int64_t> p2p_seq_;
  std::vector<CollectiveRecord> records_;
  std::unique_ptr<CommThread> thread_; // last: joined before the records and maps go
};

} // namespace meshsim
