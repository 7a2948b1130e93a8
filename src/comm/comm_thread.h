// CommThread: one rank's communication thread, as NCCL's stream is to a GPU's compute.
//
// The in-process backend hands it every collective and message of its rank, in the order the
// rank called them, and it runs them one at a time while the rank's own thread goes on
// computing. A blocking call is a submit followed at once by wait(); an *_async call returns
// with its operation queued (comm/communicator.h's Work).
//
// After an operation fails, the ones queued behind it fail at once with the same error: a
// rank's communicator is broken from then on, so a rank that waits on its last operation
// learns of the first failure within one collective timeout, not one per queued operation.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/recorder.h"

namespace meshsim {

/// One queued collective or message.
struct CommOp {
  std::function<void()> run;         // on the communication thread; moves data, no allocation
  std::vector<at::Tensor> keep;      // its buffers, alive until the rank has waited
  // Written by the communication thread, under CommThread's mutex:
  bool done = false;
  double start_s = 0;
  double end_s = 0;
  std::exception_ptr error;
};

class CommThread {
public:
  explicit CommThread(const RunClock& clock);
  /// Runs what is queued (failing fast once the world is aborted), then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  void submit(std::shared_ptr<CommOp> op);
  /// Blocks until `op` is done; false if `timeout` passed first.
  bool wait(const CommOp& op, std::chrono::milliseconds timeout);

private:
  void loop();

  const RunClock& clock_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<CommOp>> queue_;
  std::exception_ptr broken_;  // the first failure; every later operation fails with it
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

} // namespace meshsim
