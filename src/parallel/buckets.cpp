// Flat gradient buckets for DDP (all-reduce) and DataParallel (reduce to GPU 0).
#include "parallel/buckets.h"

#include "memory/allocator.h"

namespace meshsim {

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

void GradientBuckets::reduce_sum(Communicator& comm, int root, const Group& group) {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    flatten(b);
    comm.reduce(b.buffer, root, ReduceOp::Sum, group);
    if (comm.rank() == root) unflatten(b);
  }
}

} // namespace meshsim
