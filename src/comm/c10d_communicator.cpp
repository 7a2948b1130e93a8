// The c10d backend's communicator: the Communicator calls on c10d's process groups (Gloo's,
// or NCCL's on CUDA), recorded as the in-process backend records them. See c10d_backend.h.
#if MESHSIM_C10D_GLOO

#include <fmt/format.h>

#include "comm/c10d_state.h"
#include "memory/allocator.h"
#include "memory/virtual_gpu.h"

namespace meshsim {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
  case ReduceOp::Max: return c10d::ReduceOp::MAX;
  default: return c10d::ReduceOp::SUM;  // Avg: a sum, then divided (Gloo has no average)
  }
}


class C10dCommunicator final : public Communicator {
public:
  explicit C10dCommunicator(std::shared_ptr<C10dWorld::State> state) : s_(std::move(state)) {}

  ~C10dCommunicator() override {
    // Messages still in flight: their receivers get them, or the run failed already.
    for (auto& pending : sends_) {
      try {
        pending.work->wait(s_->options.timeout);
      } catch (const std::exception&) {
      }
    }
  }

  int rank() const override { return s_->options.rank; }
  int world_size() const override { return s_->options.world_size; }
  const std::vector<CollectiveRecord>& records() const override { return records_; }

  void all_reduce(torch::Tensor& tensor, ReduceOp op, const Group& group) override {
    torch::Tensor buf = tensor.is_contiguous() ? tensor : tensor.contiguous();
    all_reduce_async(buf, op, group, false)->wait();
    if (!buf.is_same(tensor))
      tensor.copy_(buf);
  }

  std::unique_ptr<Work> all_reduce_async(torch::Tensor tensor, ReduceOp op,
                                         const Group& group) override {
    if (!tensor.is_contiguous())
      throw std::invalid_argument("all_reduce_async: the tensor must be contiguous");
    return all_reduce_async(tensor, op, group, true);
  }

  void broadcast(torch::Tensor& tensor, int root, const Group& group) override {
    const int root_index = member(group, root, "broadcast root");
    torch::Tensor buf = tensor.is_contiguous() ? tensor : tensor.contiguous();
    const size_t at = begin("broadcast", group, buf);
    run(at, group, [&] {
      std::vector<at::Tensor> v{buf};
      c10d::BroadcastOptions o;
      o.rootRank = root_index;
      return s_->group(group, buf.is_cuda())->broadcast(v, o);
    });
    if (!buf.is_same(tensor))
      tensor.copy_(buf);
  }

  torch::Tensor all_gather(const torch::Tensor& input, const Group& group) override {
    torch::Tensor in = input.contiguous();
    torch::Tensor out = all_gather_output(in, group.size());
    const size_t at = begin("all_gather", group, in);
    run(at, group, [&] {
      std::vector<std::vector<at::Tensor>> outs(1);
      for (int i = 0; i < group.size(); ++i)
        outs[0].push_back(out[i]);
      std::vector<at::Tensor> ins{in};
      return s_->group(group, in.is_cuda())->allgather(outs, ins);
    });
    return out;
  }

  torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op,
                               const Group& group) override {
    torch::Tensor out = reduce_scatter_output(input, group.size());
    reduce_scatter_async(input.contiguous(), out, op, group)->wait();
    return out;
  }

  std::unique_ptr<Work> reduce_scatter_async(const torch::Tensor& input, torch::Tensor output,
                                             ReduceOp op, const Group& group) override {
    const int index = member(group, rank(), "rank");
    if (input.numel() % group.size() != 0 || output.numel() * group.size() != input.numel())
      throw std::invalid_argument(
          fmt::format("reduce_scatter: an output of {} elements for {} over {} ranks",
                      output.numel(), input.numel(), group.size()));
    // Gloo has no reduce-scatter: the whole input is all-reduced in a copy, and this member
    // keeps its chunk (twice the traffic of a ring reduce-scatter; recorded as one).
    torch::Tensor whole;
    {
      CategoryScope scope(MemoryCategory::Communication);
      whole = input.contiguous().clone();
    }
    const size_t at = begin("reduce_scatter", group, input);
    auto work = launch(at, group, [&] { return allreduce(whole, op, group); });
    const int n = group.size();
    return std::make_unique<Pending>(*this, at, group, std::move(work), true,
                                     [whole, output, op, n, index]() mutable {
                                       torch::NoGradGuard no_grad;
                                       auto chunk = whole.narrow(0, index * output.numel(),
                                                                 output.numel());
                                       if (op == ReduceOp::Avg)
                                         chunk.div_(n);
                                       output.copy_(chunk);
                                     });
  }

  void reduce(torch::Tensor& tensor, int root, ReduceOp op, const Group& group) override {
    const int root_index = member(group, root, "reduce root");
    // Gloo may use a non-root's buffer as scratch: they reduce a copy.
    torch::Tensor buf = rank() == root && tensor.is_contiguous() ? tensor : tensor.contiguous();
    if (rank() != root) {
      CategoryScope scope(MemoryCategory::Communication);
      buf = tensor.contiguous().clone();
    }
    const size_t at = begin("reduce", group, buf);
    run(at, group, [&] {
      std::vector<at::Tensor> v{buf};
      c10d::ReduceOptions o;
      o.reduceOp = to_c10d(op);
      o.rootRank = root_index;
      return s_->group(group, buf.is_cuda())->reduce(v, o);
    });
    if (rank() == root) {
      if (op == ReduceOp::Avg)
        buf.div_(group.size());
      if (!buf.is_same(tensor))
        tensor.copy_(buf);
    }
  }

  // A message is its header (dtype, rank and sizes: the receiver allocates from it) and its
  // payload, under tags 2·tag and 2·tag + 1 of the world's group. Sends are buffered, as the
  // in-process backend's are: a copy is sent, and reaped once done.
  void send(const torch::Tensor& tensor, int dst, int tag) override {
    finish(post_send(tensor, dst, tag));
  }

  torch::Tensor recv(int src, int tag) override {
    peer(src, "recv");
    const Group pair{{src, rank()}};
    const size_t at = begin_p2p("recv", pair, torch::Tensor(), src, tag);
    torch::Tensor header = torch::empty({kHeaderSize}, torch::kLong);
    torch::Tensor out;
    try {
      const Group world = Group::world(world_size());
      std::vector<at::Tensor> h{header};
      s_->group(world)->recv(h, src, 2 * tag)->wait(s_->options.timeout);
      out = from_header(header);
      std::vector<at::Tensor> p{out};
      s_->group(world, out.is_cuda())->recv(p, src, 2 * tag + 1)->wait(s_->options.timeout);
    } catch (const std::exception& e) {
      fail(at, pair, e);
    }
    records_[at].bytes = out.numel() * out.element_size();
    finish(at);
    return out;
  }

  void barrier(const Group& group) override {
    const size_t at = begin("barrier", group, torch::Tensor());
    run(at, group, [&] { return s_->group(group)->barrier(); });
  }

  torch::Tensor all_to_all(const torch::Tensor& input,
                           const std::vector<int64_t>& output_split_sizes,
                           const std::vector<int64_t>& input_split_sizes,
                           const Group& group) override {
    member(group, rank(), "rank");
    const AllToAllSplits splits =
        all_to_all_splits(input, output_split_sizes, input_split_sizes, group.size());
    torch::Tensor in = input.contiguous();
    torch::Tensor out = all_to_all_output(in, splits);
    const size_t at = begin("all_to_all", group, in);
    records_[at].peer_bytes = all_to_all_peer_bytes(in, splits);
    if (group.size() == 1) { // nobody to wait for
      if (splits.output[0] != splits.input[0])
        throw std::invalid_argument(
            fmt::format("all_to_all: rank {} sends itself {} rows but expects {}", rank(),
                        splits.input[0], splits.output[0]));
      out.copy_(in);
      finish(at);
      return out;
    }
    // Gloo's and NCCL's all_to_all_single: a peer's disagreeing split fails its transfer.
    run(at, group, [&] {
      std::vector<int64_t> out_rows = splits.output, in_rows = splits.input;
      return s_->group(group, in.is_cuda())->alltoall_base(out, in, out_rows, in_rows);
    });
    return out;
  }

  std::unique_ptr<Work> isend(const torch::Tensor& tensor, int dst, int tag) override {
    const size_t at = post_send(tensor, dst, tag);
    // The Work waits for both transfers (a c10d Work is waited on once): they leave sends_,
    // and its `after` keeps their buffers alive until then.
    PendingSend payload = sends_.back(), header = sends_[sends_.size() - 2];
    sends_.resize(sends_.size() - 2);
    const Group pair{{rank(), dst}};
    return std::make_unique<Pending>(
        *this, at, pair, std::vector<c10::intrusive_ptr<c10d::Work>>{header.work, payload.work},
        true, [buffers = std::vector<torch::Tensor>{header.buffer, payload.buffer}] {});
  }

  // The header and the payload are both posted at once: the payload straight into `output`.
  std::unique_ptr<Work> irecv(torch::Tensor output, int src, int tag) override {
    peer(src, "recv");
    if (!output.is_contiguous())
      throw std::invalid_argument("irecv: the tensor must be contiguous");
    const Group pair{{src, rank()}};
    const size_t at = begin_p2p("recv", pair, torch::Tensor(), src, tag);
    torch::Tensor header = torch::empty({kHeaderSize}, torch::kLong);
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    try {
      const Group world = Group::world(world_size());
      std::vector<at::Tensor> h{header}, p{output};
      works.push_back(s_->group(world)->recv(h, src, 2 * tag));
      works.push_back(s_->group(world, output.is_cuda())->recv(p, src, 2 * tag + 1));
    } catch (const std::exception& e) {
      fail(at, pair, e);
    }
    return std::make_unique<Pending>(*this, at, pair, std::move(works), true,
                                     [this, header, output, src, at] {
                                       torch::Tensor shape = from_header(header, torch::kMeta);
                                       check_irecv_fits(output, shape, src);
                                       records_[at].bytes = output.numel() * output.element_size();
                                     });
  }

private:
  static constexpr int64_t kHeaderSize = 11;  // dtype, on a card, rank, up to 8 sizes

  // A started collective: waits for c10d's Work, then runs `after` (an average's division, a
  // reduce-scatter's chunk) on the rank's thread.
  class Pending final : public Work {
  public:
    Pending(C10dCommunicator& comm, size_t record, Group group,
            std::vector<c10::intrusive_ptr<c10d::Work>> works, bool async,
            std::function<void()> after)
        : comm_(comm), record_(record), group_(std::move(group)), works_(std::move(works)),
          async_(async), after_(std::move(after)) {}
    Pending(C10dCommunicator& comm, size_t record, Group group,
            c10::intrusive_ptr<c10d::Work> work, bool async, std::function<void()> after)
        : Pending(comm, record, std::move(group),
                  std::vector<c10::intrusive_ptr<c10d::Work>>{std::move(work)}, async,
                  std::move(after)) {}
    // Never waited on (a rank unwinding from a failure): c10d's Work is released after a
    // wait of its own, so that the error a Gloo thread stored in it is seen to be complete
    // before it is freed here; the wait's own failure is dropped.
    ~Pending() override {
      if (done_)
        return;
      for (auto& work : works_) {
        try {
          work->wait(comm_.s_->options.timeout);
        } catch (const std::exception&) {
        }
      }
    }
    void wait() override {
      if (done_)
        return;
      done_ = true;
      try {
        for (auto& work : works_)
          work->wait(comm_.s_->options.timeout);
      } catch (const std::exception& e) {
        comm_.fail(record_, group_, e);
      }
      if (after_)
        after_();
      comm_.finish(record_, async_);
    }

  private:
    C10dCommunicator& comm_;
    size_t record_;
    Group group_;
    std::vector<c10::intrusive_ptr<c10d::Work>> works_;
    bool async_;
    std::function<void()> after_;
    bool done_ = false;
  };

  struct PendingSend {
    c10::intrusive_ptr<c10d::Work> work;
    torch::Tensor buffer;  // alive until sent
  };

  // Starts send's two transfers (kept in sends_ until done); returns the record's index.
  size_t post_send(const torch::Tensor& tensor, int dst, int tag) {
    peer(dst, "send");
    const Group pair{{rank(), dst}};
    const size_t at = begin_p2p("send", pair, tensor, dst, tag);
    torch::Tensor payload, header;
    {
      CategoryScope scope(MemoryCategory::Communication);
      payload = tensor.detach().clone(at::MemoryFormat::Contiguous);
      header = make_header(payload);
    }
    reap_sends();
    try {
      // The header always through Gloo (it is on the host); the payload through the group of
      // its device (NCCL for a card's tensor).
      const Group world = Group::world(world_size());
      std::vector<at::Tensor> h{header}, p{payload};
      sends_.push_back({s_->group(world)->send(h, dst, 2 * tag), header});
      sends_.push_back({s_->group(world, payload.is_cuda())->send(p, dst, 2 * tag + 1), payload});
    } catch (const std::exception& e) {
      fail(at, pair, e);
    }
    return at;
  }

  // Gloo's in-place sum (an average is a sum, divided afterwards) or max of `t` over `group`.
  c10::intrusive_ptr<c10d::Work> allreduce(const torch::Tensor& t, ReduceOp op,
                                           const Group& group) {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    return s_->group(group, t.is_cuda())->allreduce(v, o);
  }

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& buf, ReduceOp op,
                                         const Group& group, bool async) {
    const size_t at = begin("all_reduce", group, buf);
    auto work = launch(at, group, [&] { return allreduce(buf, op, group); });
    const int n = group.size();
    std::function<void()> after;
    if (op == ReduceOp::Avg)
      after = [buf, n]() mutable {
        torch::NoGradGuard no_grad;
        buf.div_(n);
      };
    return std::make_unique<Pending>(*this, at, group, std::move(work), async, std::move(after));
  }

  int member(const Group& group, int rank, const char* what) const {
    const int index = group.index_of(rank);
    if (index < 0)
      throw std::invalid_argument(
          fmt::format("{} {} is not in group [{}]", what, rank, group.key()));
    return index;
  }

  void peer(int p, const char* op) const {
    if (p < 0 || p >= world_size() || p == rank())
      throw std::invalid_argument(fmt::format("{} on rank {}: invalid peer {} (world size {})", op,
                                              rank(), p, world_size()));
  }

  size_t begin(const char* op, const Group& group, const torch::Tensor& t) {
    member(group, rank(), "rank");
    CollectiveRecord rec;
    rec.op = op;
    rec.group = group.ranks;
    rec.bytes = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    rec.seq = seq_[group.key()]++;
    rec.start_s = s_->clock->now();
    rec.start_charges = thread_charge_count();
    records_.push_back(std::move(rec));
    return records_.size() - 1;
  }

  size_t begin_p2p(const char* op, const Group& pair, const torch::Tensor& t, int other,
                   int tag) {
    CollectiveRecord rec;
    rec.op = op;
    rec.group = pair.ranks;
    rec.bytes = t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
    rec.peer = other;
    rec.seq = p2p_seq_[{other, rec.op == std::string("send") ? tag : -1 - tag}]++;
    rec.start_s = s_->clock->now();
    rec.start_charges = thread_charge_count();
    records_.push_back(std::move(rec));
    return records_.size() - 1;
  }

  void finish(size_t at, bool async = false) {
    CollectiveRecord& rec = records_[at];
    rec.end_s = s_->clock->now();
    rec.end_charges = thread_charge_count();
    if (async) {
      rec.waited_s = rec.end_s;
      rec.start_charges = rec.end_charges;
    }
  }

  [[noreturn]] void fail(size_t at, const Group& group, const std::exception& e) {
    const CollectiveRecord& rec = records_[at];
    const std::string where =
        rec.peer >= 0
            ? fmt::format("{} #{} on rank {} {} rank {}", rec.op, rec.seq, rank(),
                          rec.op == "send" ? "to" : "from", rec.peer)
            : fmt::format("{} #{} on group [{}]", rec.op, rec.seq, group.key());
    s_->note_failure();
    throw CollectiveTimeout(fmt::format("{} failed: {}{}", where, c10d_message(e),
                                        s_->missing(group.ranks)));
  }

  c10::intrusive_ptr<c10d::Work> launch(size_t at, const Group& group,
                                        const std::function<c10::intrusive_ptr<c10d::Work>()>& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      fail(at, group, e);
    }
  }

  void run(size_t at, const Group& group,
           const std::function<c10::intrusive_ptr<c10d::Work>()>& f) {
    Pending(*this, at, group, launch(at, group, f), false, nullptr).wait();
  }

  void reap_sends() {
    while (!sends_.empty() && sends_.front().work->isCompleted()) {
      sends_.front().work->wait();  // rethrows a failed send
      sends_.erase(sends_.begin());
    }
  }

  static torch::Tensor make_header(const torch::Tensor& t) {
    if (t.dim() > kHeaderSize - 3)
      throw std::invalid_argument(
          fmt::format("send: tensors of at most {} dimensions, not {}", kHeaderSize - 3, t.dim()));
    torch::Tensor h = torch::zeros({kHeaderSize}, torch::kLong);
    auto* p = h.data_ptr<int64_t>();
    p[0] = static_cast<int64_t>(t.scalar_type());
    p[1] = t.is_cuda() ? 1 : 0;
    p[2] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d)
      p[3 + d] = t.size(d);
    return h;
  }

  // The message's tensor, allocated; on `device` when given (kMeta: its shape alone).
  torch::Tensor from_header(const torch::Tensor& h,
                            c10::optional<c10::DeviceType> device = c10::nullopt) {
    const auto* p = h.data_ptr<int64_t>();
    std::vector<int64_t> sizes(p + 3, p + 3 + p[2]);
    auto options = torch::TensorOptions().dtype(static_cast<c10::ScalarType>(p[0]));
    if (device)
      options = options.device(*device);
    else if (p[1] != 0)
      options = options.device(torch::kCUDA);  // this process's card: the current device
    return torch::empty(sizes, options);
  }

  std::shared_ptr<C10dWorld::State> s_;
  std::map<std::string, int64_t> seq_;
  std::map<std::pair<int, int>, int64_t> p2p_seq_;
  std::vector<CollectiveRecord> records_;
  std::vector<PendingSend> sends_;
};

} // namespace

std::unique_ptr<Communicator> C10dWorld::make_communicator() {
  return std::make_unique<C10dCommunicator>(state_);
}

} // namespace meshsim

#endif
