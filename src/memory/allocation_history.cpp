#include "memory/allocation_history.h"

namespace meshsim {

void AllocationHistory::record(bool alloc, uint64_t address, int64_t size,
                               MemoryCategory category) {
  const double t =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({t, alloc, address, size, category});
  if (alloc)
    live_[address] = {address, size, category, t};
  else
    live_.erase(address);
}

void AllocationHistory::drop_before(double time_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!events_.empty() && events_.front().time_s < time_s) events_.pop_front();
}

std::vector<AllocationEvent> AllocationHistory::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {events_.begin(), events_.end()};
}

std::vector<LiveBlock> AllocationHistory::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LiveBlock> out;
  for (const auto& [address, block] : live_) out.push_back(block);
  return out;
}

} // namespace meshsim
