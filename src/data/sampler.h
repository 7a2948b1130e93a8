// DistributedSampler: splits a data set's indices across data-parallel ranks exactly like
// torch.utils.data.DistributedSampler (PyTorch 1.13), so runs are comparable with PyTorch DDP.
#pragma once

#include <cstdint>
#include <vector>

namespace meshsim {

class DistributedSampler {
public:
  /// Throws std::invalid_argument for a negative size, num_replicas < 1 or rank outside
  /// [0, num_replicas), as PyTorch raises ValueError.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  /// The shuffle of epoch e is seeded with seed + e; call before each epoch.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  /// This rank's indices for the current epoch (num_samples() of them).
  std::vector<int64_t> indices() const;
  /// The whole epoch's order before it is dealt out to ranks (total_size() entries, padded or
  /// truncated); rank r gets entries r, r + num_replicas, ...
  std::vector<int64_t> epoch_order() const;

  int64_t num_samples() const { return num_samples_; } // per rank
  int64_t total_size() const { return num_samples_ * num_replicas_; }

private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_ = 0;
};

} // namespace meshsim
