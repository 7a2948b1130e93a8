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
#include "comm/recorder.h"
#include "device/physical_device.h"

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

  struct Slot; // one collective instance, shared by its members

private:
  friend class SimCommunicator;

  // What a blocked rank waits for: the members missing from `slot`, or a send from `src`.
  struct Wait {
    std::shared_ptr<Slot> slot;
    std::vector<int> group;
    int src = -1;
  };
  /// Ranks `rank` waits for now (empty when it is not blocked). Call with mutex_ held.
  std::vector<int> waited_by(int rank) const;
  /// " (rank 1 waits for rank 2, which waits for rank 3)": follows the waits from `missing`
  /// to a rank that waits for nobody, the one that stopped. Call with mutex_ held.
  std::string wait_chain(const std::vector<int>& missing) const;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  const RunClock* clock_;
  RunClock own_clock_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<Slot>> slots_;
  // A message waiting for its receiver; on a CUDA card, with the event after which it exists.
  struct Message {
    torch::Tensor tensor;
    std::shared_ptr<DeviceEvent> ready;
  };
  std::map<std::tuple<int, int, int>, std::deque<Message>> mailboxes_; // (src, dst, tag)
  std::string abort_reason_;
  std::vector<Wait> waits_; // per rank
};

} // namespace meshsim
