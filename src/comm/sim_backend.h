// The in-process backend: ranks are threads of one process and collectives move data
// directly between their buffers.
//
// A collective is a rendezvous: every member registers its buffers, the last to arrive wakes
// the others, each member then reduces/copies its own 1/n slice of the data into every
// member's output (so each byte is read once and written once, like a ring's total traffic
// without its steps), and all members wait until every slice is done before returning.
// Waits are condition variables with deadlines; abort() wakes every waiter at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "mesh/recorder.h"

namespace meshsim {

class SimWorld {
public:
  SimWorld(int world_size, std::chrono::milliseconds timeout, const RunClock* clock = nullptr);
  ~SimWorld();

  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// The communicator of one rank; call once per rank.
  std::unique_ptr<Communicator> make_communicator(int rank);

  /// Fails every pending and future wait with RankAborted(reason). Idempotent.
  void abort(const std::string& reason);
  bool aborted() const;

  struct Slot;  // one collective instance, shared by its members

private:
  friend class SimCommunicator;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  const RunClock* clock_;
  RunClock own_clock_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<Slot>> slots_;
  std::map<std::tuple<int, int, int>, std::deque<torch::Tensor>> mailboxes_;  // (src, dst, tag)
  std::string abort_reason_;
};

} // namespace meshsim
