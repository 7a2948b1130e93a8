// Progress on long work: a bar redrawn in place on a terminal, plain periodic lines when
// stderr is a file or a pipe (CI logs, `make run | tee`).
#pragma once

#include <cstdint>
#include <string>

namespace meshsim {

class Progress {
public:
  Progress(int64_t total_steps, int64_t every, bool enabled);
  /// Reports `step` of the total; `status` is shown after the bar (loss, samples/s).
  void update(int64_t step, const std::string& status);
  /// Ends the bar's line before other output.
  void finish();

private:
  int64_t total_;
  int64_t every_;
  bool enabled_;
  bool terminal_;
  bool open_line_ = false;
};

} // namespace meshsim
