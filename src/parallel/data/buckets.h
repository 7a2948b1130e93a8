// Gradient buckets: parameters grouped, in reverse order as PyTorch's DDP does (the last
// layers' gradients are ready first), into flat buffers of at most `bucket_mb` so each
// bucket is one collective.
//
// With overlap (DDP's default), a hook on each parameter's gradient accumulator counts the
// gradients backward has produced; once a bucket has all of its own, the bucket is flattened
// and its all-reduce started (Communicator::all_reduce_async) while backward goes on, and
// finish_overlapped() waits for them all before the optimizer step. Buckets start in order,
// as PyTorch's reducer starts them, so every rank calls the same collectives in the same
// order whatever order its hooks fire in.
#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

class GradientBuckets {
public:
  /// Allocates the flat buffers now, charged to `communication`.
  GradientBuckets(const std::vector<torch::Tensor>& params, double bucket_mb);

  int size() const { return static_cast<int>(buckets_.size()); }
  int64_t buffer_bytes() const;

  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  /// For each bucket: flatten the gradients into it, all-reduce (average) it, copy back.
  void all_reduce_average(Communicator& comm, const Group& group);

  /// Overlap: from now on, the next backward starts each bucket's all-reduce (average) over
  /// `group` as soon as its gradients are all there. Registers the hooks on the first call.
  void start_overlapped(Communicator& comm, const Group& group);
  /// After backward: starts the buckets not started yet (parameters that got no gradient),
  /// waits for every all-reduce, and copies the averages back into the gradients.
  void finish_overlapped();
  /// For each bucket: flatten, sum onto `root`, and (on root) copy back.
  void reduce_sum(Communicator& comm, int root, const Group& group);

private:
  struct Bucket {
    std::vector<torch::Tensor> params;
    torch::Tensor buffer;
  };
  class ReadyHook;
  static void flatten(Bucket& b);
  static void unflatten(Bucket& b);
  /// A hook saw parameter `param`'s gradient accumulated: starts the buckets now complete.
  void gradient_ready(size_t param);
  void launch(size_t bucket);

  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // per parameter, in the constructor's order

  // Overlap (start_overlapped): the hooks, and this backward's progress.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  Communicator* comm_ = nullptr;
  Group group_;
  bool armed_ = false;
  std::vector<size_t> missing_;  // per bucket: gradients not produced yet
  size_t next_launch_ = 0;
  std::vector<std::unique_ptr<Work>> in_flight_;
};

} // namespace meshsim
