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
#include <functional>
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

  /// One collective instance, shared by its members.
  struct Slot {
    std::string op;
    int64_t numel = 0;
    c10::ScalarType dtype = c10::ScalarType::Float;
    int root = -1;
    std::vector<void*> in;
    std::vector<void*> out;
    std::vector<bool> present;
    int arrived = 0;
    int departed = 0;
    // On a CUDA card: each member's buffers are ready after its `ready` event, and its work
    // on the others' buffers is done after its `done` event (device/physical_device.h).
    bool on_card = false;
    std::vector<DeviceEvent> ready, done;
    // all_to_all: each member's split sizes, in rows (numel above is the elements per row).
    std::vector<std::vector<int64_t>> in_splits, out_splits;
  };

  /// One member's arrival at a collective.
  struct Arrival {
    int rank = 0;
    const char* op = "";
    std::vector<int> ranks;  // the group
    std::string key;         // the group's key
    int64_t seq = 0;
    int index = 0;           // the rank's index in the group
    int64_t numel = 0;
    c10::ScalarType dtype = c10::ScalarType::Float;
    bool on_card = false;
    int root = -1;
    void* in = nullptr;
    void* out = nullptr;
    std::vector<int64_t> in_splits{};   // all_to_all only
    std::vector<int64_t> out_splits{};
  };

private:
  friend class SimCommunicator;

  // What a blocked rank waits for: the members missing from `slot`, or a send from `src`.
  struct Wait {
    std::shared_ptr<Slot> slot;
    std::vector<int> group;
    int src = -1;
  };
  /// The rendezvous every collective shares (sim_world.cpp): arrive, run `work` on this
  /// member's slice once every member is here, depart once every member's work is done.
  /// On the rank's communication thread; `ready` is recorded after its buffers exist.
  void rendezvous(const Arrival& a, DeviceEvent ready, const std::function<void(Slot&, int)>& work);
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
