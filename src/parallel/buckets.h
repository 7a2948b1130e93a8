// Gradient buckets: parameters grouped, in reverse order as PyTorch's DDP does (the last
// layers' gradients are ready first), into flat buffers of at most `bucket_mb` so each
// bucket is one collective.
#pragma once

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

  /// For each bucket: flatten the gradients into it, all-reduce (average) it, copy back.
  void all_reduce_average(Communicator& comm, const Group& group);
  /// For each bucket: flatten, sum onto `root`, and (on root) copy back.
  void reduce_sum(Communicator& comm, int root, const Group& group);

private:
  struct Bucket {
    std::vector<torch::Tensor> params;
    torch::Tensor buffer;
  };
  static void flatten(Bucket& b);
  static void unflatten(Bucket& b);

  std::vector<Bucket> buckets_;
};

} // namespace meshsim
