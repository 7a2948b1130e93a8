// DistributedSampler, a line-by-line port of torch/utils/data/distributed.py (PyTorch 1.13).
// The shuffle uses LibTorch's CPU generator and randperm, i.e. the very code Python calls, so
// the permutations match torch.Generator().manual_seed(seed + epoch) bit for bit.
#include "data/sampler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace meshsim {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle),
      seed_(seed), drop_last_(drop_last) {
  if (dataset_size < 0)
    throw std::invalid_argument("DistributedSampler: negative dataset size");
  if (num_replicas < 1)
    throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1, got " +
                                std::to_string(num_replicas));
  if (rank < 0 || rank >= num_replicas)
    throw std::invalid_argument("DistributedSampler: invalid rank " + std::to_string(rank) +
                                ", rank should be in the interval [0, " +
                                std::to_string(num_replicas - 1) + "]");
  const int64_t n = dataset_size, r = num_replicas;
  // Python: ceil((n - r) / r) when dropping a ragged tail, which equals floor(n / r) for
  // n % r != 0 (including n < r, where it is 0); otherwise ceil(n / r).
  num_samples_ = (drop_last && n % r != 0) ? n / r : (n + r - 1) / r;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
}

std::vector<int64_t> DistributedSampler::epoch_order() const {
  const int64_t n = dataset_size_;
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(std::max(n, total_size())));
  if (shuffle_) {
    // Unsigned wrap-around matches manual_seed's treatment of the Python int seed + epoch.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    const torch::Tensor perm = torch::randperm(n, gen, torch::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    order.assign(p, p + n);
  } else {
    for (int64_t i = 0; i < n; ++i)
      order.push_back(i);
  }
  const int64_t total = total_size();
  if (!drop_last_) {
    // Pad by cycling from the start (Python repeats the list as often as needed).
    for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i)
      order.push_back(order[i]);
  } else {
    order.resize(static_cast<size_t>(total));
  }
  return order;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> order = epoch_order();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total_size(); i += num_replicas_)
    mine.push_back(order[i]);
  return mine;
}

} // namespace meshsim
