// A virtual GPU's allocation history, for `--memory-snapshot` (PyTorch's memory snapshot
// format, report/memory_snapshot.h): every allocation and free with its address, size and
// category, and the blocks live now. Kept only when asked for: a GPU without a history pays
// one pointer check per allocation.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "memory/category.h"

namespace meshsim {

struct AllocationEvent {
  double time_s = 0;  // since the history's origin (the run's clock)
  bool alloc = true;  // false: a free
  uint64_t address = 0;
  int64_t size = 0;
  MemoryCategory category = MemoryCategory::Other;
};

struct LiveBlock {
  uint64_t address = 0;
  int64_t size = 0;
  MemoryCategory category = MemoryCategory::Other;
  double since_s = 0;
};

/// Thread-safe: allocations and frees come from the rank's thread and from any thread that
/// drops a tensor's last reference.
class AllocationHistory {
public:
  explicit AllocationHistory(std::chrono::steady_clock::time_point origin) : origin_(origin) {}

  void record(bool alloc, uint64_t address, int64_t size, MemoryCategory category);
  /// Forgets the events before `time_s` (the live blocks stay).
  void drop_before(double time_s);

  std::vector<AllocationEvent> events() const;
  /// The blocks allocated and not yet freed, by address.
  std::vector<LiveBlock> live() const;

private:
  const std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::deque<AllocationEvent> events_;
  std::map<uint64_t, LiveBlock> live_;
};

} // namespace meshsim
