// The c10d backend: each rank a process of its own, collectives through PyTorch's c10d
// process groups (Gloo on the CPU, NCCL on CUDA), so a layout debugged on virtual GPUs runs unchanged on
// real processes and nodes (docs/processes.md).
//
// C10dWorld is one process's end of the run: the rendezvous (a TCPStore on rank 0's host,
// at MASTER_ADDR:MASTER_PORT), the world's process group, and one process group per group of
// ranks a strategy uses, made the first time this process calls a collective on it. Its
// communicator records every call as the in-process backend does (comm/recorder.h), so the
// memory accounting, the trace and the predictions work the same way.
//
// Failures: the rendezvous (a port in use, processes that disagree on the world size, a
// rank taken twice, nobody there) throws RendezvousError; a collective whose peer died or
// hung throws CollectiveTimeout naming the rank that went missing, found from the
// heartbeats each process keeps in the store.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "comm/recorder.h"

namespace meshsim {

/// The rendezvous failed: the message says why, on one line.
class RendezvousError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct C10dOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// How long the rendezvous and every collective may take.
  std::chrono::milliseconds timeout{60000};
  /// "cpu": Gloo's process groups; "cuda": NCCL's, on this process's card (the first it
  /// sees: give each process its own with CUDA_VISIBLE_DEVICES), where c10d_nccl_available().
  std::string device = "cpu";
};

/// Whether this build has a c10d backend (LibTorch built with distributed and Gloo).
bool c10d_available();
/// Whether it also has NCCL's (LibTorch built with CUDA and NCCL).
bool c10d_nccl_available();
/// Why --backend c10d cannot run on `device` in this build, on one line; "" when it can
/// ("cpu" through Gloo, "cuda" or "cuda:0" through NCCL where this build has it).
std::string c10d_device_refusal(const std::string& device);

class C10dWorld {
public:
  /// Joins the rendezvous; returns once every process of the world has.
  C10dWorld(const C10dOptions& options, const RunClock& clock);
  ~C10dWorld();
  C10dWorld(const C10dWorld&) = delete;
  C10dWorld& operator=(const C10dWorld&) = delete;

  int rank() const;
  int world_size() const;
  /// This process's rank's communicator; call once.
  std::unique_ptr<Communicator> make_communicator();

  /// Blocks until every process has reached the barrier `name` (through the store, not a
  /// process group, so it also works after a collective failed), or throws after the timeout.
  void store_barrier(const std::string& name);
  /// Rank 0's `value` under `name`, on every process: rank 0 publishes its own, the others
  /// wait for it (up to the timeout) and ignore theirs.
  std::string share(const std::string& name, const std::string& value);
  /// Every process's `value` under `name`, in rank order, on every process (each waits, up to
  /// the timeout, for all of them).
  std::vector<std::string> all_gather(const std::string& name, const std::string& value);
  /// The first value any process offered under `name` (a compare-and-set in the store):
  /// `value` when this process is the first. Does not wait.
  std::string agree(const std::string& name, const std::string& value);
  /// The value agreed under `name`, or "" while there is none. Does not wait.
  std::string agreed(const std::string& name);

  struct State;

private:
  std::shared_ptr<State> state_;
};

} // namespace meshsim
