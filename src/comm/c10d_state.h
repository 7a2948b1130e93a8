// The state of one process's end of a run made of processes, shared by C10dWorld and its
// communicator (c10d_backend.cpp, c10d_communicator.cpp). Internal to comm/.
#pragma once

#if MESHSIM_C10D_GLOO

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

// NCCL: where CMake found the CUDA path, Gloo and the nccl.h of LibTorch's NCCL
// (MESHSIM_C10D_NCCL, CMakeLists.txt), and LibTorch's CUDA target defines USE_C10D_NCCL, the
// macro ProcessGroupNCCL.hpp itself is guarded by. Elsewhere nothing of it is compiled, and
// --backend c10d --device cuda is refused in one line.
#if MESHSIM_C10D_NCCL && !defined(USE_C10D_NCCL)
#undef MESHSIM_C10D_NCCL
#define MESHSIM_C10D_NCCL 0
#endif
#if MESHSIM_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "comm/c10d_backend.h"

namespace meshsim {

/// What Gloo's and NCCL's process groups derive from, and the Communicator calls through:
/// c10d::ProcessGroup in LibTorch 1.x; from 2.0 on, c10d::Backend (a ProcessGroup holds one
/// Backend per device type there).
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

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
  std::map<std::string, c10::intrusive_ptr<C10dGroup>> groups;

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

  /// The process group of `g` for tensors on the host (Gloo's) or, `on_card`, on this
  /// process's card (NCCL's), as torch.distributed's "cpu:gloo,cuda:nccl": a CUDA run's
  /// activations and gradients go through NCCL, its few host-side tensors (loss sums, flags,
  /// message headers) through Gloo. Made the first time this process uses it (every member
  /// makes it at its first collective on it, under the group's own prefix in the store).
  c10::intrusive_ptr<C10dGroup> group(const Group& g, bool on_card = false);
};

} // namespace meshsim

#endif
