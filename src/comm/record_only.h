// The plan backend: collectives that only record what they would move.
//
// `meshsim plan` runs the strategies on meta tensors (shapes, no data) and executes only the
// ranks that differ by symmetry, so a collective's other members may never run. Each
// collective here is therefore recorded (op, group, bytes, sequence number, as the in-process
// backend records it) and returns at once: outputs get their real shapes and are charged to
// the caller's GPU, nothing is reduced, nobody is waited for. Point-to-point messages are
// real (pipeline stages run and exchange activations) and go through the wrapped backend;
// the message in flight is not charged to the sender (a cluster's send reads the tensor the
// stage holds anyway), so every rank's bytes depend on its own program alone.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/recorder.h"

namespace meshsim {

class RecordOnlyCommunicator final : public Communicator {
public:
  /// `p2p` carries send/recv (its records are taken over); `clock` stamps the records;
  /// `route`, if set, says where a message for a peer that does not run goes instead (the
  /// records name the peer).
  RecordOnlyCommunicator(std::unique_ptr<Communicator> p2p, const RunClock& clock,
                         P2pRoute route = nullptr);

  int rank() const override { return p2p_->rank(); }
  int world_size() const override { return p2p_->world_size(); }
  const std::vector<CollectiveRecord>& records() const override { return records_; }

  /// In place, left as they are: every member holds the same tensor by symmetry.
  void all_reduce(torch::Tensor& tensor, ReduceOp op, const Group& group) override;
  void broadcast(torch::Tensor& tensor, int root, const Group& group) override;
  void reduce(torch::Tensor& tensor, int root, ReduceOp op, const Group& group) override;
  /// [group.size(), *input.sizes()], every row this member's input (a plan's members are alike).
  torch::Tensor all_gather(const torch::Tensor& input, const Group& group) override;
  /// This member's chunk of the input, uninitialized (meta tensors have no values anyway).
  torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op,
                               const Group& group) override;
  /// Recorded now; the rank's wait on it is recorded as CollectiveRecord::waited_s.
  std::unique_ptr<Work> all_reduce_async(torch::Tensor tensor, ReduceOp op,
                                         const Group& group) override;
  std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor output,
                                             ReduceOp op, const Group& group) override;
  /// Recorded now, the output left as it is (a plan's members are alike; meta has no values).
  std::unique_ptr<Work> all_gather_async(const torch::Tensor& input, torch::Tensor output,
                                         const Group& group) override;
  /// The output's shape from the splits, uninitialized; the record keeps the bytes per peer.
  torch::Tensor all_to_all(const torch::Tensor& input,
                           const std::vector<int64_t>& output_split_sizes,
                           const std::vector<int64_t>& input_split_sizes,
                           const Group& group) override;
  void send(const torch::Tensor& tensor, int dst, int tag = 0) override;
  torch::Tensor recv(int src, int tag = 0) override;
  /// Through the wrapped backend's; the record is taken over when the rank waits.
  std::unique_ptr<Work> isend(const torch::Tensor& tensor, int dst, int tag = 0) override;
  std::unique_ptr<Work> irecv(torch::Tensor output, int src, int tag = 0) override;
  void barrier(const Group& group) override;

private:
  class RecordedWork;
  class MessageWork;
  void record(const char* op, const Group& group, const torch::Tensor& tensor);
  int routed(int peer) const { return route_ ? route_(rank(), peer) : peer; }
  /// The wrapped backend's record of a message, naming `peer` where it was routed elsewhere.
  CollectiveRecord p2p_record(size_t index, int peer) const;
  void take_p2p_record(int peer);

  std::unique_ptr<Communicator> p2p_;
  const RunClock& clock_;
  P2pRoute route_;
  std::map<std::string, int64_t> seq_; // per group, as the in-process backend counts
  std::vector<CollectiveRecord> records_;
};

} // namespace meshsim
