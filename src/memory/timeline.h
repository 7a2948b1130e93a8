// MemoryTimeline: memory.csv's rows, the live bytes of every GPU at the instants ranks sampled
// them. Shared by all ranks, appended under a mutex.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "memory/category.h"

namespace meshsim {

/// One row of memory.csv: the live bytes of every GPU at one instant, and the physical card's
/// NVML reading at that instant (CUDA runs where NVML is available; absent otherwise).
struct MemorySample {
  double time_s = 0;
  int64_t step = 0;
  std::string phase;
  std::vector<int64_t> bytes;  // one per GPU
  // The same bytes by category (MemoryCategory order), one array per GPU; empty when the
  // sample was made without them (tests' hand-made samples).
  std::vector<CategoryBytes> by_category{};
  std::optional<int64_t> phys_used_bytes = std::nullopt;  // the card's used memory
  std::optional<int> phys_util_pct = std::nullopt;        // the card's utilisation, percent
  int rank = -1;  // the rank whose phase ended (-1: none in particular)
};

/// Samples shared by all ranks, appended under a mutex.
class MemoryTimeline {
public:
  void add(MemorySample sample) {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_.push_back(std::move(sample));
  }
  std::vector<MemorySample> samples() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return samples_;
  }

private:
  mutable std::mutex mutex_;
  std::vector<MemorySample> samples_;
};

} // namespace meshsim
