// In-process collectives. See sim_backend.h for the algorithm; the messages are in
// sim_messages.cpp.
#include "comm/sim_backend.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/comm_thread.h"
#include "comm/sim_communicator.h"
#include "comm/kernels.h"
#include "memory/allocator.h"
#include "memory/virtual_gpu.h"
#if MESHSIM_CUDA
#include "comm/cuda_kernels.h"
#endif

namespace meshsim {


namespace {

// The slice of `numel` elements that group member `index` of `n` works on.
std::pair<int64_t, int64_t> slice_of(int64_t numel, int n, int index) {
  const int64_t base = numel / n, extra = numel % n;
  const int64_t lo = index * base + std::min<int64_t>(index, extra);
  return {lo, lo + base + (index < extra ? 1 : 0)};
}

void* at_offset(void* p, int64_t bytes) { return static_cast<char*>(p) + bytes; }

#if MESHSIM_CUDA
CudaDtype cuda_dtype(c10::ScalarType dtype) {
  switch (dtype) {
  case c10::ScalarType::Float: return CudaDtype::Float;
  case c10::ScalarType::Double: return CudaDtype::Double;
  case c10::ScalarType::Long: return CudaDtype::Long;
  case c10::ScalarType::Int: return CudaDtype::Int;
  case c10::ScalarType::BFloat16: return CudaDtype::BFloat16;
  case c10::ScalarType::Half: return CudaDtype::Half;
  default:
    throw std::invalid_argument(std::string("reductions support float, double, bfloat16, half, "
                                            "int and long, not ") + c10::toString(dtype));
  }
}
#endif

// Elements [lo, hi) of every input combined into every output: on the CPU, or on the card
// in one kernel on the calling rank's stream.
void combine(const SimWorld::Slot& s, const std::vector<void*>& inputs,
             const std::vector<void*>& outputs, int64_t lo, int64_t hi, ReduceOp op, int count) {
  if (outputs.empty() || lo >= hi)
    return;
  if (!s.on_card)
    return reduce_into(s.dtype, inputs, outputs, lo, hi, op, count);
#if MESHSIM_CUDA
  if (inputs.size() > kMaxCudaReduceBuffers || outputs.size() > kMaxCudaReduceBuffers)
    throw std::invalid_argument(fmt::format("collectives on a CUDA card combine at most {} ranks "
                                            "per group, not {}",
                                            kMaxCudaReduceBuffers, inputs.size()));
  const CudaReduce reduce = op == ReduceOp::Avg ? CudaReduce::Avg
                            : op == ReduceOp::Max ? CudaReduce::Max
                                                  : CudaReduce::Sum;
  reduce_into_cuda(cuda_dtype(s.dtype), inputs.data(), static_cast<int>(inputs.size()),
                   outputs.data(), static_cast<int>(outputs.size()), lo, hi, reduce, count,
                   current_stream_handle());
#endif
}

// Elements [lo, hi) of `src` copied into every output, whatever the dtype: memcpy on the CPU,
// one kernel moving bytes on the card.
void copy_to_all(const SimWorld::Slot& s, void* src, const std::vector<void*>& outputs,
                 int64_t lo, int64_t hi) {
  if (outputs.empty() || lo >= hi)
    return;
  const int64_t item = c10::elementSize(s.dtype);
  if (!s.on_card) {
    for (void* out : outputs)
      if (out != src) // an in-place all-gather: a member's own slot is its input
        std::memcpy(at_offset(out, lo * item), at_offset(src, lo * item), (hi - lo) * item);
    return;
  }
#if MESHSIM_CUDA
  if (outputs.size() > kMaxCudaReduceBuffers)
    throw std::invalid_argument(fmt::format("collectives on a CUDA card reach at most {} ranks "
                                            "per group, not {}",
                                            kMaxCudaReduceBuffers, outputs.size()));
  const void* in[] = {src};
  reduce_into_cuda(CudaDtype::Byte, in, 1, outputs.data(), static_cast<int>(outputs.size()),
                   lo * item, hi * item, CudaReduce::Sum, 1, current_stream_handle());
#endif
}

} // namespace

void SimCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op, const Group& group) {
  torch::Tensor buf = contiguous(tensor);
  all_reduce_async(buf, op, group, false)->wait();
  if (!buf.is_same(tensor))
    tensor.copy_(buf);
}

std::unique_ptr<Work> SimCommunicator::all_reduce_async(torch::Tensor tensor, ReduceOp op,
                                                        const Group& group) {
  check_contiguous(tensor, "all_reduce_async");
  return all_reduce_async(tensor, op, group, true);
}

void SimCommunicator::broadcast(torch::Tensor& tensor, int root, const Group& group) {
  const int root_index = checked_member(group, root, "broadcast root");
  torch::Tensor buf = contiguous(tensor);
  const int n = group.size();
  collective("broadcast", group, buf, buf.data_ptr(), buf.data_ptr(), root, {buf}, false,
             [n, root_index](SimWorld::Slot& s, int index) {
               auto [lo, hi] = slice_of(s.numel, n, index);
               std::vector<void*> others;
               for (int j = 0; j < n; ++j)
                 if (j != root_index)
                   others.push_back(s.out[j]);
               copy_to_all(s, s.in[root_index], others, lo, hi);
             })
      ->wait();
  if (!buf.is_same(tensor))
    tensor.copy_(buf);
}

torch::Tensor SimCommunicator::all_gather(const torch::Tensor& input, const Group& group) {
  torch::Tensor in = input.contiguous();
  torch::Tensor out = all_gather_output(in, group.size());
  all_gather_async(in, out, group, false)->wait();
  return out;
}

std::unique_ptr<Work> SimCommunicator::all_gather_async(const torch::Tensor& input,
                                                        torch::Tensor output,
                                                        const Group& group) {
  check_contiguous(input, "all_gather_async");
  check_contiguous(output, "all_gather_async");
  return all_gather_async(input, output, group, true);
}

torch::Tensor SimCommunicator::reduce_scatter(const torch::Tensor& input, ReduceOp op,
                                              const Group& group) {
  torch::Tensor out = reduce_scatter_output(input, group.size());
  reduce_scatter_async(input.contiguous(), out, op, group, false)->wait();
  return out;
}

std::unique_ptr<Work> SimCommunicator::reduce_scatter_async(const torch::Tensor& input,
                                                            torch::Tensor output, ReduceOp op,
                                                            const Group& group) {
  check_contiguous(input, "reduce_scatter_async");
  check_contiguous(output, "reduce_scatter_async");
  return reduce_scatter_async(input, output, op, group, true);
}

void SimCommunicator::reduce(torch::Tensor& tensor, int root, ReduceOp op, const Group& group) {
  const int root_index = checked_member(group, root, "reduce root");
  torch::Tensor buf = contiguous(tensor);
  const int n = group.size();
  collective("reduce", group, buf, buf.data_ptr(), buf.data_ptr(), root, {buf}, false,
             [n, root_index, op](SimWorld::Slot& s, int index) {
               auto [lo, hi] = slice_of(s.numel, n, index);
               combine(s, s.in, {s.out[root_index]}, lo, hi, op, n);
             })
      ->wait();
  if (rank_ == root && !buf.is_same(tensor))
    tensor.copy_(buf);
}

torch::Tensor SimCommunicator::all_to_all(const torch::Tensor& input,
                                          const std::vector<int64_t>& output_split_sizes,
                                          const std::vector<int64_t>& input_split_sizes,
                                          const Group& group) {
  const int index = checked_member(group, rank_, "rank");
  AllToAllSplits splits =
      all_to_all_splits(input, output_split_sizes, input_split_sizes, group.size());
  torch::Tensor in = input.contiguous();
  torch::Tensor out = all_to_all_output(in, splits);
  const int n = group.size();
  if (n == 1) { // nobody to wait for
    CollectiveRecord rec = start_record("all_to_all", group.ranks, in);
    rec.seq = seq_[group.key()]++;
    rec.peer_bytes = all_to_all_peer_bytes(in, splits);
    if (splits.output[0] != splits.input[0])
      throw std::invalid_argument(
          fmt::format("all_to_all: rank {} sends itself {} rows but expects {}", rank_,
                      splits.input[0], splits.output[0]));
    out.copy_(in);
    rec.end_s = clock().now();
    rec.end_charges = thread_charge_count();
    records_.push_back(std::move(rec));
    return out;
  }
  // Every member needs the others' splits: its own rows go into their outputs.
  SimWorld::Arrival arrival{rank_, "all_to_all", group.ranks, group.key(), 0, index,
                            splits.row_numel, in.scalar_type(), in.is_cuda(), -1,
                            in.numel() > 0 ? in.data_ptr() : nullptr,
                            out.numel() > 0 ? out.data_ptr() : nullptr};
  arrival.in_splits = splits.input;
  arrival.out_splits = splits.output;
  collective(std::move(arrival), group, in, {in, out}, false,
             [n](SimWorld::Slot& s, int index) {
               const int64_t row = s.numel; // elements per row, alike on every member
               // Checked by every member alike, so that all of them fail together.
               for (int i = 0; i < n; ++i)
                 for (int j = 0; j < n; ++j)
                   if (s.in_splits[i][j] != s.out_splits[j][i])
                     throw CollectiveMismatch(fmt::format(
                         "all_to_all: group member {} sends member {} {} rows, which expects {}",
                         i, j, s.in_splits[i][j], s.out_splits[j][i]));
               const int64_t item = c10::elementSize(s.dtype);
               int64_t from = 0;
               for (int j = 0; j < n; ++j) {
                 int64_t to = 0;
                 for (int i = 0; i < index; ++i)
                   to += s.out_splits[j][i];
                 const int64_t rows = s.in_splits[index][j];
                 if (rows > 0)
                   copy_to_all(s, at_offset(s.in[index], from * row * item),
                               {at_offset(s.out[j], to * row * item)}, 0, rows * row);
                 from += rows;
               }
             })
      ->wait();
  return out;
}

void SimCommunicator::barrier(const Group& group) {
  torch::Tensor none;
  collective("barrier", group, none, nullptr, nullptr, -1, {}, false, [](SimWorld::Slot&, int) {})
      ->wait();
}

std::unique_ptr<Work> SimCommunicator::all_reduce_async(const torch::Tensor& buf, ReduceOp op,
                                                        const Group& group, bool async) {
  const int n = group.size();
  return collective("all_reduce", group, buf, buf.data_ptr(), buf.data_ptr(), -1, {buf}, async,
                    [n, op](SimWorld::Slot& s, int index) {
                      auto [lo, hi] = slice_of(s.numel, n, index);
                      combine(s, s.in, s.out, lo, hi, op, n);
                    });
}

std::unique_ptr<Work> SimCommunicator::reduce_scatter_async(const torch::Tensor& in,
                                                            const torch::Tensor& out, ReduceOp op,
                                                            const Group& group, bool async) {
  if (in.numel() % group.size() != 0)
    throw std::invalid_argument(
        fmt::format("reduce_scatter: {} elements do not split evenly over {} ranks", in.numel(),
                    group.size()));
  if (out.numel() * group.size() != in.numel())
    throw std::invalid_argument(
        fmt::format("reduce_scatter: an output of {} elements for {} over {} ranks", out.numel(),
                    in.numel(), group.size()));
  const int n = group.size();
  return collective("reduce_scatter", group, in, in.data_ptr(), out.data_ptr(), -1, {in, out},
                    async, [n, op](SimWorld::Slot& s, int index) {
                      const int64_t chunk = s.numel / n;
                      const int64_t item = c10::elementSize(s.dtype);
                      // Member `index` reduces chunk `index` of every input into its output.
                      std::vector<void*> in_ptrs(n);
                      for (int j = 0; j < n; ++j)
                        in_ptrs[j] = at_offset(s.in[j], index * chunk * item);
                      combine(s, in_ptrs, {s.out[index]}, 0, chunk, op, n);
                    });
}

std::unique_ptr<Work> SimCommunicator::all_gather_async(const torch::Tensor& in,
                                                        const torch::Tensor& out,
                                                        const Group& group, bool async) {
  check_all_gather_output(in, out, group.size());
  const int n = group.size();
  return collective("all_gather", group, in, in.data_ptr(), out.data_ptr(), -1, {in, out}, async,
                    [n](SimWorld::Slot& s, int index) {
                      const int64_t bytes = s.numel * c10::elementSize(s.dtype);
                      std::vector<void*> outs;
                      for (int j = 0; j < n; ++j)
                        outs.push_back(at_offset(s.out[j], index * bytes));
                      copy_to_all(s, s.in[index], outs, 0, s.numel);
                    });
}

void SimCommunicator::check_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.is_contiguous())
    throw std::invalid_argument(std::string(what) + ": the tensor must be contiguous");
}

int SimCommunicator::checked_member(const Group& group, int rank, const char* what) const {
  const int index = group.index_of(rank);
  if (index < 0)
    throw std::invalid_argument(fmt::format("{} {} is not in group [{}]", what, rank, group.key()));
  return index;
}

void SimCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= world_.world_size() || peer == rank_)
    throw std::invalid_argument(fmt::format("{} on rank {}: invalid peer {} (world size {})", op,
                                            rank_, peer, world_.world_size()));
}

CollectiveRecord SimCommunicator::start_record(const char* op, std::vector<int> group,
                                               const torch::Tensor& t) {
  CollectiveRecord rec;
  rec.op = op;
  rec.group = std::move(group);
  rec.bytes = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
  rec.start_s = clock().now();
  rec.start_charges = thread_charge_count();
  return rec;
}

std::unique_ptr<Work> SimCommunicator::submit(CollectiveRecord rec, std::shared_ptr<CommOp> op,
                                              bool async, std::function<void()> finish,
                                              bool on_card) {
  const size_t index = records_.size();
  records_.push_back(std::move(rec));
  if (on_card) {
    op->start_s = clock().now();
    try {
      op->run();
    } catch (...) {
      op->error = std::current_exception();
    }
    op->end_s = clock().now();
    op->done = true;
  } else {
    if (!thread_)
      thread_ = std::make_unique<CommThread>(clock());
    thread_->submit(op);
  }
  return std::make_unique<SimWork>(*this, std::move(op), index, async, on_card, std::move(finish));
}

std::unique_ptr<Work> SimCommunicator::collective(const char* op, const Group& group,
                                                  const torch::Tensor& meta, void* in, void* out,
                                                  int root, std::vector<torch::Tensor> keep,
                                                  bool async,
                                                  std::function<void(SimWorld::Slot&, int)> work) {
  const int index = checked_member(group, rank_, "rank");
  SimWorld::Arrival arrival{rank_,
                            op,
                            group.ranks,
                            group.key(),
                            0,
                            index,
                            meta.defined() ? meta.numel() : 0,
                            meta.defined() ? meta.scalar_type() : c10::ScalarType::Float,
                            meta.defined() && meta.is_cuda(),
                            root,
                            in,
                            out};
  return collective(std::move(arrival), group, meta, std::move(keep), async, std::move(work));
}

std::unique_ptr<Work> SimCommunicator::collective(SimWorld::Arrival arrival, const Group& group,
                                                  const torch::Tensor& meta,
                                                  std::vector<torch::Tensor> keep, bool async,
                                                  std::function<void(SimWorld::Slot&, int)> work) {
  arrival.seq = seq_[arrival.key]++;
  CollectiveRecord rec = start_record(arrival.op, group.ranks, meta);
  rec.seq = arrival.seq;
  if (!arrival.in_splits.empty()) // all_to_all: bytes sent to each member
    for (int64_t rows : arrival.in_splits)
      rec.peer_bytes.push_back(rows * arrival.numel * static_cast<int64_t>(meta.element_size()));
  const bool on_card = arrival.on_card;
  auto ready = std::make_shared<DeviceEvent>(); // this member's buffers exist from here
  if (on_card)
    ready->record();
  auto task = std::make_shared<CommOp>();
  task->keep = std::move(keep);
  task->run = [world = &world_, arrival = std::move(arrival), ready, work = std::move(work)] {
    world->rendezvous(arrival, std::move(*ready), work);
  };
  return submit(std::move(rec), std::move(task), async, nullptr, on_card);
}

void SimWork::wait() {
  if (waited_)
    return;
  waited_ = true;
  // An operation takes at most two collective timeouts (arriving, then departing); the ones
  // queued before it fail at once after a failure (comm_thread.h).
  const auto limit = 2 * comm_.world_.timeout() + std::chrono::milliseconds(5000);
  const bool queued = comm_.thread_ != nullptr && !inline_;
  if (queued && !comm_.thread_->wait(*op_, limit))
    throw CollectiveTimeout(fmt::format("{} #{} on rank {} did not complete within {:.1f} s",
                                        comm_.records_[record_].op, comm_.records_[record_].seq,
                                        comm_.rank_, limit.count() / 1000.0));
  CollectiveRecord& rec = comm_.records_[record_];
  rec.start_s = op_->start_s;
  rec.end_s = op_->end_s;
  rec.end_charges = thread_charge_count();
  if (async_) {
    rec.waited_s = comm_.clock().now();
    rec.start_charges = rec.end_charges;
  }
  op_->keep.clear();
  if (op_->error)
    std::rethrow_exception(op_->error);
  if (finish_)
    finish_();
}

std::unique_ptr<Communicator> SimWorld::make_communicator(int rank) {
  if (rank < 0 || rank >= world_size_)
    throw std::invalid_argument(
        fmt::format("rank {} out of range for world {}", rank, world_size_));
  return std::make_unique<SimCommunicator>(*this, rank);
}

} // namespace meshsim
