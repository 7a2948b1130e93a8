// StopPoint: the agreement rule of stop.h.
#include "train/stop.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

namespace meshsim {

void StopPoint::request(StopReason reason, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reason_ != StopReason::None)
    return;
  reason_ = reason;
  why_ = why;
}

bool StopPoint::should_stop(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reason_ == StopReason::None && signal_ && signal_->load() != 0) {
    reason_ = StopReason::Signal;
    why_ = "stopped by signal " + std::to_string(signal_->load());
  }
  if (world_) { // one rank per process: the decision is the store's, "S reason why"
    if (stop_after_ < 0) {
      const std::string decided =
          reason_ != StopReason::None
              ? world_->agree("stop", fmt::format("{} {} {}", step + 1, static_cast<int>(reason_), why_))
              : world_->agreed("stop");
      if (!decided.empty()) {
        std::istringstream in(decided);
        int reason = 0;
        in >> stop_after_ >> reason;
        if (reason_ == StopReason::None) { // another process's reason
          reason_ = static_cast<StopReason>(reason);
          std::getline(in >> std::ws, why_);
        }
      }
    }
    return stop_after_ >= 0 && step >= stop_after_;
  }
  if (reason_ != StopReason::None && stop_after_ < 0)
    stop_after_ = furthest_passed_ + 1;
  if (stop_after_ >= 0 && step >= stop_after_)
    return true;
  furthest_passed_ = std::max(furthest_passed_, step);
  return false;
}

StopReason StopPoint::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

std::string StopPoint::why() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return why_;
}

} // namespace meshsim
