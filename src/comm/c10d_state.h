// The state of one process's end of a run made of processes, shared by C10dWorld and its
// communicator (c10d_backend.cpp, c10d_communicator.cpp). Internal to comm/.
#pragma once

#ifdef USE_C10D_GLOO

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/c10d_backend.h"

namespace meshsim {

/// How often a process tells the store it is alive.
constexpr auto kHeartbeat = std::chrono::milliseconds(250);

/// The first line of an exception's message (LibTorch's carry a backtrace).
std::string c10d_message(const std::exception& e);

struct C10dWorld::State {
  C10dOptions options;
  const RunClock* clock = nullptr;
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> pg_options;
  std::mutex groups_mutex;  // the rank thread makes groups; Gloo's threads never touch this
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroupGloo>> groups;

  // The heartbeat: a counter in the store, raised every kHeartbeat by a thread with its own
  // connection, so a rank that stopped can be told from one that is only slow.
  c10::intrusive_ptr<c10d::TCPStore> heartbeat_store;
  std::mutex heartbeat_mutex;
  std::condition_variable heartbeat_cv;
  bool stopping = false;
  std::thread heartbeat;

  ~State();

  std::string key(const std::string& name) const { return "meshsim/" + name; }

  /// The heartbeat thread: raises this rank's counter every kHeartbeat until the end.
  void beat();

  /// Tells the others that this rank's collectives failed, so that its silence is not taken
  /// for the cause (missing() leaves it out).
  void note_failure();

  /// " (rank 2 is gone: ...)": the members of `ranks` whose heartbeat stopped without their
  /// saying they failed (note_failure), by reading the counters twice, four beats apart.
  std::string missing(const std::vector<int>& ranks);

  /// The process group of `g`, made the first time this process uses it (every member makes
  /// it at its first collective on it, under the group's own prefix in the store).
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group(const Group& g);
};

} // namespace meshsim

#endif
