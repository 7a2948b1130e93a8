// One `meshsim plan` run as a child process of the server, with a deadline: a plan that runs
// past it is killed, and its memory goes back with the process.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace meshsim {

struct ChildResult {
  int exit_code = -1;     // the child's exit status; -1 when a signal ended it
  int signal = 0;         // the signal that ended it, else 0
  bool timed_out = false; // killed at the deadline
  std::string out;        // its stdout (at most ChildLimits::max_output bytes kept)
  std::string err;        // its stderr (likewise)
  double seconds = 0;
};

struct ChildLimits {
  double max_seconds = 60;
  size_t max_output = 16 << 20;
  /// When set and true, the child is killed (checked at least every 200 ms): the server
  /// stopping.
  const std::atomic<bool>* cancel = nullptr;
};

/// Runs argv[0] with `argv` (no shell), stdin from /dev/null, no other descriptor inherited,
/// every signal unblocked. Throws std::runtime_error (one line) when it cannot be started.
ChildResult run_child(const std::vector<std::string>& argv, const ChildLimits& limits);

} // namespace meshsim
