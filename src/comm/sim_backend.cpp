// In-process collectives. See sim_backend.h for the algorithm.
#include "comm/sim_backend.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/comm_thread.h"
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

  void all_reduce(torch::Tensor& tensor, ReduceOp op, const Group& group) override {
    torch::Tensor buf = contiguous(tensor);
    all_reduce_async(buf, op, group, false)->wait();
    if (!buf.is_same(tensor))
      tensor.copy_(buf);
  }

  std::unique_ptr<Work> all_reduce_async(torch::Tensor tensor, ReduceOp op,
                                         const Group& group) override {
    check_contiguous(tensor, "all_reduce_async");
    return all_reduce_async(tensor, op, group, true);
  }

  void broadcast(torch::Tensor& tensor, int root, const Group& group) override {
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

  torch::Tensor all_gather(const torch::Tensor& input, const Group& group) override {
    torch::Tensor in = input.contiguous();
    torch::Tensor out = all_gather_output(in, group.size());
    const int n = group.size();
    collective("all_gather", group, in, in.data_ptr(), out.data_ptr(), -1, {in, out}, false,
               [n](SimWorld::Slot& s, int index) {
                 const int64_t bytes = s.numel * c10::elementSize(s.dtype);
                 std::vector<void*> outs;
                 for (int j = 0; j < n; ++j)
                   outs.push_back(at_offset(s.out[j], index * bytes));
                 copy_to_all(s, s.in[index], outs, 0, s.numel);
               })
        ->wait();
    return out;
  }

  torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op,
                               const Group& group) override {
    torch::Tensor out = reduce_scatter_output(input, group.size());
    reduce_scatter_async(input.contiguous(), out, op, group, false)->wait();
    return out;
  }

  std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor output,
                                             ReduceOp op, const Group& group) override {
    check_contiguous(input, "reduce_scatter_async");
    check_contiguous(output, "reduce_scatter_async");
    return reduce_scatter_async(input, output, op, group, true);
  }

  void reduce(torch::Tensor& tensor, int root, ReduceOp op, const Group& group) override {
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

  void send(const torch::Tensor& tensor, int dst, int tag) override {
    check_peer(dst, "send");
    CollectiveRecord rec = start_record("send", {rank_, dst}, tensor);
    rec.peer = dst;
    rec.seq = p2p_seq_[{dst, tag}]++;
    torch::Tensor message;
    {
      // The message is charged to the sender until the receiver has copied it out.
      CategoryScope scope(MemoryCategory::Communication);
      message = tensor.detach().clone(at::MemoryFormat::Contiguous);
    }
    std::shared_ptr<DeviceEvent> ready;
    if (message.is_cuda()) { // the copy exists once the sender's stream has made it
      ready = std::make_shared<DeviceEvent>();
      ready->record();
    }
    SimWorld* world = &world_;
    const int from = rank_;
    auto op = std::make_shared<CommOp>();
    // The mailbox holds the message from here on, so the operation keeps nothing itself.
    auto boxed = std::make_shared<SimWorld::Message>(SimWorld::Message{message, ready});
    message = torch::Tensor();
    op->run = [world, from, dst, tag, boxed] {
      {
        std::lock_guard<std::mutex> lock(world->mutex_);
        if (!world->abort_reason_.empty())
          throw RankAborted(world->abort_reason_);
        world->mailboxes_[{from, dst, tag}].push_back(std::move(*boxed));
      }
      world->cv_.notify_all();
    };
    submit(std::move(rec), std::move(op), false, nullptr)->wait();
  }

  torch::Tensor recv(int src, int tag) override {
    check_peer(src, "recv");
    CollectiveRecord rec = start_record("recv", {src, rank_}, torch::Tensor());
    rec.peer = src;
    rec.seq = p2p_seq_[{src, -1 - tag}]++;
    const int64_t seq = rec.seq;
    auto message = std::make_shared<SimWorld::Message>();
    SimWorld* world = &world_;
    const int to = rank_;
    auto op = std::make_shared<CommOp>();
    op->run = [world, to, src, tag, seq, message] {
      std::unique_lock<std::mutex> lock(world->mutex_);
      auto& box = world->mailboxes_[{src, to, tag}];
      world->waits_[to] = SimWorld::Wait{nullptr, {}, src};
      const bool ready = world->cv_.wait_for(
          lock, world->timeout_, [&] { return !box.empty() || !world->abort_reason_.empty(); });
      // A rank that times out keeps its wait on record: others' chains go through it.
      if (ready)
        world->waits_[to] = SimWorld::Wait{};
      if (!world->abort_reason_.empty())
        throw RankAborted(world->abort_reason_);
      if (!ready)
        throw CollectiveTimeout(fmt::format("recv #{} on rank {} from rank {} (tag {}) timed out "
                                            "after {:.1f} s: rank {} never sent{}",
                                            seq, to, src, tag, world->timeout_.count() / 1000.0,
                                            src, world->wait_chain({src})));
      *message = std::move(box.front());
      box.pop_front();
    };
    torch::Tensor out;
    const size_t index = records_.size();
    submit(std::move(rec), std::move(op), false, [&, message, index] {
      // The copy is made on the rank's own thread, so it is charged to this rank's GPU.
      if (message->ready)
        message->ready->block_current_stream();
      out = torch::empty_like(message->tensor);
      out.copy_(message->tensor);
      // Frees the sender's copy; on a card, only once this stream's copy out of it has run.
      hold_for_current_stream(message->tensor);
      *message = SimWorld::Message();
      records_[index].bytes = out.numel() * out.element_size();
    })->wait();
    return out;
  }

  void barrier(const Group& group) override {
    torch::Tensor none;
    collective("barrier", group, none, nullptr, nullptr, -1, {}, false,
               [](SimWorld::Slot&, int) {})
        ->wait();
  }

private:
  friend class SimWork;

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& buf, ReduceOp op,
                                         const Group& group, bool async) {
    const int n = group.size();
    return collective("all_reduce", group, buf, buf.data_ptr(), buf.data_ptr(), -1, {buf}, async,
                      [n, op](SimWorld::Slot& s, int index) {
                        auto [lo, hi] = slice_of(s.numel, n, index);
                        combine(s, s.in, s.out, lo, hi, op, n);
                      });
  }

  std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& in, const torch::Tensor& out,
                                             ReduceOp op, const Group& group, bool async) {
    if (in.numel() % group.size() != 0)
      throw std::invalid_argument(
          fmt::format("reduce_scatter: {} elements do not split evenly over {} ranks", in.numel(),
                      group.size()));
    if (out.numel() * group.size() != in.numel())
      throw std::invalid_argument(
          fmt::format("reduce_scatter: an output of {} elements for {} over {} ranks",
                      out.numel(), in.numel(), group.size()));
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

  static torch::Tensor contiguous(torch::Tensor& t) {
    return t.is_contiguous() ? t : t.contiguous();
  }

  static void check_contiguous(const torch::Tensor& t, const char* what) {
    if (!t.is_contiguous())
      throw std::invalid_argument(std::string(what) + ": the tensor must be contiguous");
  }

  int checked_member(const Group& group, int rank, const char* what) const {
    const int index = group.index_of(rank);
    if (index < 0)
      throw std::invalid_argument(
          fmt::format("{} {} is not in group [{}]", what, rank, group.key()));
    return index;
  }

  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= world_.world_size() || peer == rank_)
      throw std::invalid_argument(fmt::format("{} on rank {}: invalid peer {} (world size {})", op,
                                              rank_, peer, world_.world_size()));
  }

  CollectiveRecord start_record(const char* op, std::vector<int> group, const torch::Tensor& t) {
    CollectiveRecord rec;
    rec.op = op;
    rec.group = std::move(group);
    rec.bytes = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    rec.start_s = clock().now();
    rec.start_charges = thread_charge_count();
    return rec;
  }

  const RunClock& clock() const { return world_.clock_ ? *world_.clock_ : world_.own_clock_; }

  // Records `rec` and runs `op`: on the communication thread (started at the first call), or
  // here on a CUDA card, where the rank's stream orders the work.
  std::unique_ptr<Work> submit(CollectiveRecord rec, std::shared_ptr<CommOp> op, bool async,
                               std::function<void()> finish, bool on_card = false) {
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
    return std::make_unique<SimWork>(*this, std::move(op), index, async, on_card,
                                     std::move(finish));
  }

  // The rendezvous shared by every collective: arrive, do this member's slice, depart.
  // `keep` are the buffers behind `in` and `out`.
  std::unique_ptr<Work> collective(const char* op, const Group& group, const torch::Tensor& meta,
                                   void* in, void* out, int root, std::vector<torch::Tensor> keep,
                                   bool async,
                                   std::function<void(SimWorld::Slot&, int)> work) {
    const int index = checked_member(group, rank_, "rank");
    const std::string key = group.key();
    const int64_t seq = seq_[key]++;
    CollectiveRecord rec = start_record(op, group.ranks, meta);
    rec.seq = seq;
    const int64_t numel = meta.defined() ? meta.numel() : 0;
    const auto dtype = meta.defined() ? meta.scalar_type() : c10::ScalarType::Float;
    const bool on_card = meta.defined() && meta.is_cuda();
    auto ready = std::make_shared<DeviceEvent>(); // this member's buffers exist from here
    if (on_card)
      ready->record();
    auto task = std::make_shared<CommOp>();
    task->keep = std::move(keep);
    SimWorld::Arrival arrival{rank_, op, group.ranks, key, seq, index,
                              numel, dtype, on_card, root, in, out};
    task->run = [world = &world_, arrival = std::move(arrival), ready, work = std::move(work)] {
      world->rendezvous(arrival, std::move(*ready), work);
    };
    return submit(std::move(rec), std::move(task), async, nullptr, on_card);
  }

  SimWorld& world_;
  const int rank_;
  std::map<std::string, int64_t> seq_;
  std::map<std::pair<int, int>, int64_t> p2p_seq_;
  std::vector<CollectiveRecord> records_;
  std::unique_ptr<CommThread> thread_; // last: joined before the records and maps go
};

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
