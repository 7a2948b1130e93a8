// Flat gradient buckets for DDP (all-reduce) and DataParallel (reduce to GPU 0).
#include "parallel/data/buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "memory/allocator.h"

namespace meshsim {

// Runs after the accumulator has added a backward's gradient into the parameter's .grad.
class GradientBuckets::ReadyHook final : public torch::autograd::FunctionPostHook {
public:
  ReadyHook(GradientBuckets& buckets, size_t param) : buckets_(buckets), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    buckets_.gradient_ready(param_);
    return outputs;
  }

private:
  GradientBuckets& buckets_;
  size_t param_;
};

GradientBuckets::GradientBuckets(const std::vector<torch::Tensor>& params, double bucket_mb) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024));
  CategoryScope scope(MemoryCategory::Communication);
  Bucket current;
  int64_t bytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    int64_t numel = 0;
    for (const auto& p : current.params) numel += p.numel();
    current.buffer = torch::empty({numel}, current.params.front().options());
    buckets_.push_back(std::move(current));
    current = Bucket{};
    bytes = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const int64_t b = it->numel() * static_cast<int64_t>(it->element_size());
    if (bytes > 0 && bytes + b > cap) close();
    current.params.push_back(*it);
    bytes += b;
  }
  close();
  // Parameter i (constructor order) went into bucket_of_[i]; buckets were filled last first.
  bucket_of_.resize(params.size());
  size_t i = params.size();
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t k = 0; k < buckets_[b].params.size(); ++k)
      bucket_of_[--i] = b;
}

GradientBuckets::~GradientBuckets() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
}

int64_t GradientBuckets::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.buffer.numel() * b.buffer.element_size();
  return n;
}

void GradientBuckets::flatten(Bucket& b) {
  int64_t offset = 0;
  for (const auto& p : b.params) {
    const int64_t n = p.numel();
    b.buffer.narrow(0, offset, n).copy_(p.grad().reshape({n}));
    offset += n;
  }
}

void GradientBuckets::unflatten(Bucket& b) {
  int64_t offset = 0;
  for (auto& p : b.params) {
    const int64_t n = p.numel();
    p.mutable_grad().copy_(b.buffer.narrow(0, offset, n).view(p.sizes()));
    offset += n;
  }
}

void GradientBuckets::all_reduce_average(Communicator& comm, const Group& group) {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    flatten(b);
    comm.all_reduce(b.buffer, ReduceOp::Avg, group);
    unflatten(b);
  }
}

void GradientBuckets::start_overlapped(Communicator& comm, const Group& group) {
  if (accumulators_.empty()) {
    size_t i = 0;
    for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it)
      for (auto p = it->params.rbegin(); p != it->params.rend(); ++p, ++i) {
        // Held here: the parameter keeps its accumulator only weakly.
        accumulators_.push_back(torch::autograd::impl::grad_accumulator(*p));
        hook_keys_.push_back(
            accumulators_.back()->add_post_hook(std::make_unique<ReadyHook>(*this, i)));
      }
  }
  comm_ = &comm;
  group_ = group;
  missing_.clear();
  for (const auto& b : buckets_)
    missing_.push_back(b.params.size());
  next_launch_ = 0;
  in_flight_.clear();
  armed_ = true;
}

void GradientBuckets::gradient_ready(size_t param) {
  if (!armed_)
    return;
  const size_t b = bucket_of_.at(param);
  if (missing_[b] > 0)
    --missing_[b];
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0)
    launch(next_launch_++);
}

void GradientBuckets::launch(size_t bucket) {
  torch::NoGradGuard no_grad;
  Bucket& b = buckets_[bucket];
  flatten(b);
  in_flight_.push_back(comm_->all_reduce_async(b.buffer, ReduceOp::Avg, group_));
}

void GradientBuckets::finish_overlapped() {
  armed_ = false;
  while (next_launch_ < buckets_.size())
    launch(next_launch_++);
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    in_flight_[b]->wait();
    unflatten(buckets_[b]);
  }
  in_flight_.clear();
}

void GradientBuckets::reduce_sum(Communicator& comm, int root, const Group& group) {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    flatten(b);
    comm.reduce(b.buffer, root, ReduceOp::Sum, group);
    if (comm.rank() == root) unflatten(b);
  }
}

} // namespace meshsim
