// The communication thread. See comm_thread.h.
#include "comm/comm_thread.h"

namespace meshsim {

CommThread::CommThread(const RunClock& clock) : clock_(clock), thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommThread::submit(std::shared_ptr<CommOp> op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
}

bool CommThread::wait(const CommOp& op, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return op.done; });
}

void CommThread::loop() {
  for (;;) {
    std::shared_ptr<CommOp> op;
    std::exception_ptr broken;
    {
      // An idle thread waits for work or for the end with no deadline: neither depends on
      // another rank, and the destructor always ends it.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty())
        return;
      op = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    const double start = clock_.now();
    std::exception_ptr error = broken;
    if (!error) {
      try {
        op->run();
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      op->start_s = start;
      op->end_s = clock_.now();
      op->error = error;
      op->done = true;
      if (error && !broken_)
        broken_ = error;
    }
    cv_.notify_all();
  }
}

} // namespace meshsim
