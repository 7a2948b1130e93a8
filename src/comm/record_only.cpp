// Record-only collectives for plans. See record_only.h.
#include "comm/record_only.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "memory/allocator.h"
#include "memory/virtual_gpu.h"

namespace meshsim {

RecordOnlyCommunicator::RecordOnlyCommunicator(std::unique_ptr<Communicator> p2p,
                                               const RunClock& clock, P2pRoute route)
    : p2p_(std::move(p2p)), clock_(clock), route_(std::move(route)) {}

void RecordOnlyCommunicator::record(const char* op, const Group& group, const torch::Tensor& t) {
  if (group.index_of(rank()) < 0)
    throw std::invalid_argument(
        fmt::format("rank {} is not in group [{}]", rank(), group.key()));
  CollectiveRecord rec;
  rec.op = op;
  rec.group = group.ranks;
  rec.bytes = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
  rec.seq = seq_[group.key()]++;
  rec.start_s = rec.end_s = clock_.now();
  rec.start_charges = rec.end_charges = thread_charge_count();
  records_.push_back(std::move(rec));
}

// Nothing moves, so waiting only marks where the rank waited.
class RecordOnlyCommunicator::RecordedWork final : public Work {
public:
  RecordedWork(RecordOnlyCommunicator& comm, size_t record) : comm_(comm), record_(record) {}
  void wait() override {
    CollectiveRecord& rec = comm_.records_[record_];
    if (rec.waited_s >= 0)
      return;
    rec.waited_s = comm_.clock_.now();
    rec.start_charges = rec.end_charges = thread_charge_count();
  }

private:
  RecordOnlyCommunicator& comm_;
  size_t record_;
};

std::unique_ptr<Work> RecordOnlyCommunicator::all_reduce_async(torch::Tensor tensor, ReduceOp,
                                                               const Group& group) {
  record("all_reduce", group, tensor);
  return std::make_unique<RecordedWork>(*this, records_.size() - 1);
}

std::unique_ptr<Work> RecordOnlyCommunicator::reduce_scatter_async(const torch::Tensor& input,
                                                                   torch::Tensor output, ReduceOp,
                                                                   const Group& group) {
  if (input.numel() % group.size() != 0 || output.numel() * group.size() != input.numel())
    throw std::invalid_argument(
        fmt::format("reduce_scatter: an output of {} elements for {} over {} ranks",
                    output.numel(), input.numel(), group.size()));
  record("reduce_scatter", group, input);
  return std::make_unique<RecordedWork>(*this, records_.size() - 1);
}

std::unique_ptr<Work> RecordOnlyCommunicator::all_gather_async(const torch::Tensor& input,
                                                               torch::Tensor output,
                                                               const Group& group) {
  check_all_gather_output(input, output, group.size());
  if (!input.is_meta()) // a copy first: the input may be a slot of the output
    output.view({group.size(), -1})
        .copy_(input.reshape({1, -1}).clone().expand({group.size(), -1}));
  record("all_gather", group, input);
  return std::make_unique<RecordedWork>(*this, records_.size() - 1);
}

CollectiveRecord RecordOnlyCommunicator::p2p_record(size_t index, int peer) const {
  CollectiveRecord rec = p2p_->records()[index];
  if (rec.peer != peer) {
    std::replace(rec.group.begin(), rec.group.end(), rec.peer, peer);
    rec.peer = peer;
  }
  return rec;
}

void RecordOnlyCommunicator::take_p2p_record(int peer) {
  records_.push_back(p2p_record(p2p_->records().size() - 1, peer));
}

void RecordOnlyCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp, const Group& group) {
  record("all_reduce", group, tensor);
}

void RecordOnlyCommunicator::broadcast(torch::Tensor& tensor, int root, const Group& group) {
  if (group.index_of(root) < 0)
    throw std::invalid_argument(
        fmt::format("broadcast root {} is not in group [{}]", root, group.key()));
  record("broadcast", group, tensor);
}

void RecordOnlyCommunicator::reduce(torch::Tensor& tensor, int root, ReduceOp, const Group& group) {
  if (group.index_of(root) < 0)
    throw std::invalid_argument(
        fmt::format("reduce root {} is not in group [{}]", root, group.key()));
  record("reduce", group, tensor);
}

torch::Tensor RecordOnlyCommunicator::all_gather(const torch::Tensor& input, const Group& group) {
  torch::Tensor in = input.contiguous();
  torch::Tensor out = all_gather_output(in, group.size());
  if (!in.is_meta())
    out.copy_(in.unsqueeze(0).expand(out.sizes()));
  record("all_gather", group, in);
  return out;
}

torch::Tensor RecordOnlyCommunicator::reduce_scatter(const torch::Tensor& input, ReduceOp,
                                                     const Group& group) {
  torch::Tensor in = input.contiguous();
  torch::Tensor out = reduce_scatter_output(in, group.size());
  record("reduce_scatter", group, in);
  return out;
}

void RecordOnlyCommunicator::send(const torch::Tensor& tensor, int dst, int tag) {
  {
    // The in-process backend's copy of the message is its own: on a cluster a send reads the
    // activation the stage keeps anyway. Charging it would also make a plan's numbers depend
    // on how far its (timeless) stages happen to run ahead of each other.
    GpuGuard host(nullptr);
    p2p_->send(tensor, routed(dst), tag);
  }
  take_p2p_record(dst);
}

torch::Tensor RecordOnlyCommunicator::recv(int src, int tag) {
  torch::Tensor out = p2p_->recv(routed(src), tag);
  take_p2p_record(src);
  return out;
}

torch::Tensor RecordOnlyCommunicator::all_to_all(const torch::Tensor& input,
                                                 const std::vector<int64_t>& output_split_sizes,
                                                 const std::vector<int64_t>& input_split_sizes,
                                                 const Group& group) {
  const AllToAllSplits splits =
      all_to_all_splits(input, output_split_sizes, input_split_sizes, group.size());
  torch::Tensor in = input.contiguous();
  torch::Tensor out = all_to_all_output(in, splits);
  record("all_to_all", group, in);
  records_.back().peer_bytes = all_to_all_peer_bytes(in, splits);
  return out;
}

// A message of the wrapped backend: its record, complete once the rank waits, replaces the
// one taken when it started.
class RecordOnlyCommunicator::MessageWork final : public Work {
public:
  MessageWork(RecordOnlyCommunicator& comm, std::unique_ptr<Work> inner, size_t record,
              size_t p2p_record, int peer)
      : comm_(comm), inner_(std::move(inner)), record_(record), p2p_record_(p2p_record),
        peer_(peer) {}
  void wait() override {
    inner_->wait();
    comm_.records_[record_] = comm_.p2p_record(p2p_record_, peer_);
  }

private:
  RecordOnlyCommunicator& comm_;
  std::unique_ptr<Work> inner_;
  size_t record_;
  size_t p2p_record_;
  int peer_;
};

std::unique_ptr<Work> RecordOnlyCommunicator::isend(const torch::Tensor& tensor, int dst,
                                                    int tag) {
  if (tag >= kSymmetricTagBase) { // a ring's exchange: the peer may not run (communicator.h)
    record("send", Group{{rank(), dst}}, tensor);
    records_.back().peer = dst;
    return std::make_unique<RecordedWork>(*this, records_.size() - 1);
  }
  std::unique_ptr<Work> work;
  {
    GpuGuard host(nullptr); // as send's: the message is not charged
    work = p2p_->isend(tensor, routed(dst), tag);
  }
  take_p2p_record(dst);
  return std::make_unique<MessageWork>(*this, std::move(work), records_.size() - 1,
                                       p2p_->records().size() - 1, dst);
}

std::unique_ptr<Work> RecordOnlyCommunicator::irecv(torch::Tensor output, int src, int tag) {
  if (tag >= kSymmetricTagBase) { // the output keeps its shape: a meta tensor has no values
    record("recv", Group{{src, rank()}}, output);
    records_.back().peer = src;
    return std::make_unique<RecordedWork>(*this, records_.size() - 1);
  }
  std::unique_ptr<Work> work = p2p_->irecv(std::move(output), routed(src), tag);
  take_p2p_record(src);
  return std::make_unique<MessageWork>(*this, std::move(work), records_.size() - 1,
                                       p2p_->records().size() - 1, src);
}

void RecordOnlyCommunicator::barrier(const Group& group) { record("barrier", group, {}); }

} // namespace meshsim
