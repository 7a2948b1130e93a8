// The in-process backend's messages: send/recv and their asynchronous forms isend/irecv, through
// SimWorld's mailboxes. A send is buffered (the message is the sender's copy until its receiver
// copies it out), so a sender never waits for its receiver. See sim_communicator.h.
#include <fmt/format.h>

#include "comm/sim_communicator.h"
#include "memory/allocator.h"
#include "memory/virtual_gpu.h"

namespace meshsim {

void SimCommunicator::send(const torch::Tensor& tensor, int dst, int tag) {
  post_send(tensor, dst, tag, false)->wait();
}

std::unique_ptr<Work> SimCommunicator::isend(const torch::Tensor& tensor, int dst, int tag) {
  return post_send(tensor, dst, tag, true);
}

torch::Tensor SimCommunicator::recv(int src, int tag) {
  auto out = std::make_shared<torch::Tensor>();
  post_recv(src, tag, false, out)->wait();
  return *out;
}

std::unique_ptr<Work> SimCommunicator::irecv(torch::Tensor output, int src, int tag) {
  check_contiguous(output, "irecv");
  return post_recv(src, tag, true, std::make_shared<torch::Tensor>(std::move(output)));
}

std::unique_ptr<Work> SimCommunicator::post_send(const torch::Tensor& tensor, int dst, int tag,
                                                 bool async) {
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
  return submit(std::move(rec), std::move(op), async, nullptr);
}

std::unique_ptr<Work> SimCommunicator::post_recv(int src, int tag, bool async,
                                                 std::shared_ptr<torch::Tensor> into) {
  check_peer(src, "recv");
  CollectiveRecord rec = start_record("recv", {src, rank_}, torch::Tensor());
  rec.peer = src;
  rec.seq = p2p_seq_[{src, -1 - tag}]++;
  const int64_t seq = rec.seq;
  auto message = std::make_shared<SimWorld::Message>();
  SimWorld* world = &world_;
  const int to = rank_;
  auto op = std::make_shared<CommOp>();
  if (into->defined())
    op->keep = {*into};
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
  const size_t index = records_.size();
  return submit(std::move(rec), std::move(op), async, [this, message, index, into, src] {
    // The copy is made on the rank's own thread, so it is charged to this rank's GPU.
    if (message->ready)
      message->ready->block_current_stream();
    const torch::Tensor& got = message->tensor;
    if (into->defined()) {
      check_irecv_fits(*into, got, src);
      into->copy_(got.view(into->sizes()));
    } else {
      *into = torch::empty_like(got);
      into->copy_(got);
    }
    // Frees the sender's copy; on a card, only once this stream's copy out of it has run.
    hold_for_current_stream(message->tensor);
    *message = SimWorld::Message();
    records_[index].bytes = into->numel() * into->element_size();
  });
}

} // namespace meshsim
