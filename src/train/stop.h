// StopPoint: how the ranks of a run agree on the step after which they all stop early
// (Ctrl-C, SIGTERM, a loss that is no longer finite), without a collective.
//
// Every rank reports each completed step. A stop is decided at the first report after it is
// requested, as "after step S", where S is the step no rank has gone past yet: ranks that
// already went on into step S finish it, the others stop at once. That S is the reporting
// rank's step or the next one, because every step ends with a collective over the world, so
// no rank is ever more than one step ahead of another.
//
// In a run made of processes (--backend c10d) each process has its own StopPoint, and the
// decision is agreed in the rendezvous store instead: the first process to decide publishes
// "after step S" (its step + 1, which no process can have gone past: that needs this one), and
// every process reads it at each report, so a signal that reaches one process stops them all.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "comm/c10d_backend.h"

namespace meshsim {

enum class StopReason { None, Signal, Diverged };

class StopPoint {
public:
  /// `signal` (may be null): non-zero once a stop was asked for from outside, e.g. by a
  /// signal handler; its value is kept as the signal number.
  explicit StopPoint(const std::atomic<int>* signal = nullptr) : signal_(signal) {}

  /// A run made of processes: agree on the stop with the other processes through `world`.
  void across_processes(C10dWorld* world) { world_ = world; }

  /// Asks every rank to stop (the first reason wins).
  void request(StopReason reason, const std::string& why);

  /// Called by every rank after it completed `step`. True when it must not start another.
  bool should_stop(int64_t step);

  StopReason reason() const;
  std::string why() const;
  int signal_number() const { return signal_ ? signal_->load() : 0; }

private:
  const std::atomic<int>* signal_;
  C10dWorld* world_ = nullptr;
  mutable std::mutex mutex_;
  int64_t furthest_passed_ = 0; // the last step some rank went past (started the next one)
  int64_t stop_after_ = -1;     // decided stop step, -1 while none
  StopReason reason_ = StopReason::None;
  std::string why_;
};

} // namespace meshsim
