// `meshsim serve`: the planner as a local web page. GET / is the page (report/plan_page.h),
// GET /api/options what it offers, POST /api/plan one plan or search (serve/plan_request.h),
// each run as `meshsim plan --json` in a child process of this binary, so a plan that runs too
// long is stopped and its memory given back.
//
// Safe to leave running: it binds loopback unless told otherwise, bodies have a size limit,
// at most `max_plans` plans run at once and `max_waiting` more wait (the rest get 503), a plan
// stops at `max_seconds` (503), and every refusal is a status with one line of JSON.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

namespace meshsim {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;         // 0: any free port (the listening line says which)
  double max_seconds = 60; // a plan's wall time, waiting for a slot included
  int max_plans = 2;       // plans at once
  int max_waiting = 8;     // requests waiting for a slot; beyond that, 503 at once
  size_t max_body_bytes = 1 << 20;
  std::string binary; // the meshsim that plans (this one: /proc/self/exe)
};

class PlanServer {
public:
  explicit PlanServer(ServeOptions options);
  ~PlanServer();
  /// Binds (std::runtime_error, one line, when it cannot), calls `listening(port)`, then
  /// serves until stop().
  void run(const std::function<void(int port)>& listening);
  /// Stops accepting, kills the plans running; run() returns. Safe from any thread.
  void stop();

private:
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace meshsim
