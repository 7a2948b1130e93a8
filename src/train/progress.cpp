// Progress bar / periodic lines.
#include "train/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace meshsim {

Progress::Progress(int64_t total_steps, int64_t every, bool enabled)
    : total_(total_steps), every_(std::max<int64_t>(1, every)), enabled_(enabled),
      terminal_(isatty(fileno(stderr)) != 0) {}

void Progress::update(int64_t step, const std::string& status) {
  if (!enabled_) return;
  if (terminal_) {
    constexpr int kWidth = 30;
    const double frac = total_ > 0 ? static_cast<double>(step) / total_ : 0;
    const int filled = static_cast<int>(frac * kWidth);
    fmt::print(stderr, "\r[{}{}] {}/{} {}\x1b[K", std::string(filled, '#'),
               std::string(kWidth - filled, '.'), step, total_, status);
    open_line_ = true;
  } else if (step % every_ == 0 || step == total_) {
    fmt::print(stderr, "step {}/{} {}\n", step, total_, status);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (open_line_) fmt::print(stderr, "\n");
  open_line_ = false;
}

} // namespace meshsim
