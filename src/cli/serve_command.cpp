// `meshsim serve`: the planner as a local web page (serve/server.h). Ctrl-C or SIGTERM stops
// it: a thread of its own waits for them, the others block them.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/integer_flag.h"
#include "serve/server.h"

namespace meshsim {

void add_serve_flags(CLI::App& app, ServeArgs& args) {
  app.add_option("--host", args.host,
                 "the address to listen on: loopback unless told otherwise (0.0.0.0: every "
                 "interface, reachable from other machines)")
      ->capture_default_str();
  add_integer_flag(app, "--port", args.port, "the port; 0 picks a free one", /*min=*/0)
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--max-seconds", args.max_seconds,
                 "a plan's longest wall time, waiting included; then it is stopped (503)")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  add_integer_flag(app, "--max-plans", args.max_plans, "plans that run at once", /*min=*/1)
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  add_integer_flag(app, "--max-waiting", args.max_waiting,
                   "requests that wait for a plan slot; beyond them, 503 at once", /*min=*/0)
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  add_integer_flag(app, "--max-body", args.max_body_bytes, "the largest request body, bytes",
                   /*min=*/1024)
      ->check(CLI::Range(int64_t{1024}, int64_t{64} << 20))
      ->capture_default_str();
}

int run_serve(const ServeArgs& args) {
  try {
    ServeOptions options;
    options.host = args.host;
    options.port = static_cast<int>(args.port);
    options.max_seconds = args.max_seconds;
    options.max_plans = static_cast<int>(args.max_plans);
    options.max_waiting = static_cast<int>(args.max_waiting);
    options.max_body_bytes = static_cast<size_t>(args.max_body_bytes);
    options.binary = std::filesystem::read_symlink("/proc/self/exe").string();

    // Every thread started from here on (httplib's) inherits the blocked mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    PlanServer server(options);
    std::atomic<bool> finished{false}, waiter_done{false};
    std::thread waiter([&] {
      int signal = 0;
      sigwait(&stop_signals, &signal);
      if (!finished) {
        fmt::print(stderr, "meshsim serve: stopping ({})\n",
                   signal == SIGINT ? "SIGINT" : "SIGTERM");
        server.stop();
      }
      waiter_done = true;
    });
    // The waiter still waits when run() ends on an error: wake it with a signal it takes.
    auto end_waiter = [&] {
      finished = true;
      if (!waiter_done)
        pthread_kill(waiter.native_handle(), SIGTERM);
      waiter.join();
    };
    try {
      server.run([&](int port) {
        fmt::print("meshsim serve: listening on http://{}:{}\n", options.host, port);
        std::fflush(stdout);
        if (options.host != "127.0.0.1" && options.host != "localhost" && options.host != "::1")
          fmt::print(stderr,
                     "meshsim serve: {} is reachable from other machines; the page has "
                     "no login\n",
                     options.host);
      });
    } catch (...) {
      end_waiter();
      throw;
    }
    end_waiter();
    return kExitOk;
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

} // namespace meshsim
