// launch(): fork and exec of one node's ranks, a self-pipe that turns SIGCHLD, SIGINT and
// SIGTERM into wake-ups of one poll() loop, and the grace-then-kill rule of launcher.h.
#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "base/printable.h"

extern char** environ;

namespace meshsim {
namespace {

using LaunchClock = std::chrono::steady_clock;

constexpr int kLaunchSignals[] = {SIGCHLD, SIGINT, SIGTERM};

/// The self-pipe, made once and never closed: a handler still running on another thread as
/// launch() returns can then never write into a descriptor that was closed and reused.
const int* launch_wake_pipe() {
  static const int* const fds = [] {
    static int made[2] = {-1, -1};
    if (pipe2(made, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error(fmt::format("launch: cannot make a pipe: {}", strerror(errno)));
    return made;
  }();
  return fds;
}

std::atomic<int> launch_wake_fd{-1}; // the write end while launch() runs, else -1

void launch_on_signal(int signal) {
  const int saved = errno;
  const int fd = launch_wake_fd.load();
  const auto byte = static_cast<unsigned char>(signal);
  // A write that fails finds the pipe full: it holds enough wake-ups already.
  [[maybe_unused]] const ssize_t written = fd >= 0 ? write(fd, &byte, 1) : 0;
  errno = saved;
}

/// Installs launch_on_signal for kLaunchSignals and unblocks them in this thread; puts the
/// handlers and the mask back when it goes.
class LaunchSignals {
public:
  LaunchSignals() : read_fd_(launch_wake_pipe()[0]) {
    int none = -1;
    if (!launch_wake_fd.compare_exchange_strong(none, launch_wake_pipe()[1]))
      throw std::logic_error("launch() is already running in this process");
    drain(); // bytes a handler wrote as a previous launch() returned
    struct sigaction action {};
    action.sa_handler = launch_on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < 3; ++i) {
      sigaction(kLaunchSignals[i], &action, &saved_[i]);
      sigaddset(&set, kLaunchSignals[i]);
    }
    pthread_sigmask(SIG_UNBLOCK, &set, &saved_mask_);
  }
  ~LaunchSignals() {
    pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
    for (int i = 0; i < 3; ++i)
      sigaction(kLaunchSignals[i], &saved_[i], nullptr);
    launch_wake_fd.store(-1);
  }
  LaunchSignals(const LaunchSignals&) = delete;
  LaunchSignals& operator=(const LaunchSignals&) = delete;

  int read_fd() const { return read_fd_; }

  /// The signals that arrived since the last call, in order.
  std::vector<int> drain() {
    std::vector<int> signals;
    unsigned char bytes[64];
    ssize_t n;
    while ((n = read(read_fd_, bytes, sizeof bytes)) > 0 || (n < 0 && errno == EINTR))
      signals.insert(signals.end(), bytes, bytes + std::max<ssize_t>(n, 0));
    return signals;
  }

private:
  int read_fd_;
  struct sigaction saved_[3];
  sigset_t saved_mask_;
};

/// `call()` again while a signal interrupts it.
template <typename Call> auto launch_retry(Call call) {
  auto result = call();
  while (result < 0 && errno == EINTR)
    result = call();
  return result;
}

} // namespace

std::string launch_signal_name(int signal) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
  if (const char* abbreviation = sigabbrev_np(signal))
    return std::string("SIG") + abbreviation;
#endif
  return fmt::format("signal {}", signal);
}

namespace {

/// The started ranks; any still running when it goes (an exception) are killed and reaped.
struct LaunchChildren {
  std::vector<RankExit> exits;
  std::vector<bool> running;

  ~LaunchChildren() {
    for (size_t i = 0; i < exits.size(); ++i) {
      if (!running[i])
        continue;
      kill(-exits[i].pid, SIGKILL);
      launch_retry([&] { return waitpid(exits[i].pid, nullptr, 0); });
    }
  }
  int count_running() const {
    return static_cast<int>(std::count(running.begin(), running.end(), true));
  }
  void signal_all(int signal) const {
    for (size_t i = 0; i < exits.size(); ++i)
      if (running[i])
        kill(-exits[i].pid, signal); // the child's process group: it and what it started
  }
};

void launch_check(const LaunchOptions& o) {
  if (o.nproc_per_node < 1)
    throw std::invalid_argument(
        fmt::format("--nproc-per-node must be at least 1, got {}", o.nproc_per_node));
  if (o.nnodes < 1)
    throw std::invalid_argument(fmt::format("--nnodes must be at least 1, got {}", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw std::invalid_argument(fmt::format("--node-rank {} is outside [0, {}) for --nnodes {}",
                                            o.node_rank, o.nnodes, o.nnodes));
  if (static_cast<int64_t>(o.nproc_per_node) * o.nnodes > INT_MAX)
    throw std::invalid_argument(
        fmt::format("{} nodes of {} processes are too many ranks", o.nnodes, o.nproc_per_node));
  if (o.command.empty() || o.command[0].empty())
    throw std::invalid_argument("launch needs a command to run");
  if (o.master_addr.empty())
    throw std::invalid_argument("--master-addr is empty");
  if (o.master_port < 1 || o.master_port > 65535)
    throw std::invalid_argument(fmt::format("--master-port {} is outside 1..65535", o.master_port));
  if (o.grace.count() < 0)
    throw std::invalid_argument(
        fmt::format("the grace period must not be negative, got {} ms", o.grace.count()));
}

/// The launcher's environment with torchrun's variables of `local_rank` in place of its own.
std::vector<std::string> launch_environment(const LaunchOptions& o, int local_rank) {
  const std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)}};
  std::vector<std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool replaced = false;
    for (const auto& [key, value] : set)
      replaced = replaced || key == name;
    if (!replaced)
      env.push_back(text);
  }
  for (const auto& [key, value] : set)
    env.push_back(key + "=" + value);
  return env;
}

/// Forks and execs one rank; returns its pid and the errno of a failed exec (0 when it ran).
std::pair<pid_t, int> launch_start(std::vector<std::string> argv, std::vector<std::string> env) {
  const auto pointers = [](std::vector<std::string>& strings) { // as execve takes them
    std::vector<char*> p;
    for (auto& s : strings)
      p.push_back(s.data());
    p.push_back(nullptr);
    return p;
  };
  const std::vector<char*> argv_p = pointers(argv), env_p = pointers(env);
  int status[2]; // the child writes exec's errno here; CLOEXEC closes it when exec works
  if (pipe2(status, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("launch: cannot make a pipe: {}", strerror(errno)));
  const pid_t parent = getpid();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); // no handler of ours may run in the child
  const pid_t pid = fork();
  if (pid == 0) {
    // Between fork and exec only async-signal-safe calls: other threads may hold locks.
    struct sigaction plain {};
    plain.sa_handler = SIG_DFL;
    sigemptyset(&plain.sa_mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGPIPE})
      sigaction(s, &plain, nullptr);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) // the launcher died before prctl
      _exit(127);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    execve(argv_p[0], argv_p.data(), env_p.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t written = write(status[1], &error, sizeof error);
    _exit(127);
  }
  const int fork_error = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(status[1]);
  if (pid < 0) {
    close(status[0]);
    throw std::runtime_error(fmt::format("launch: cannot fork: {}", strerror(fork_error)));
  }
  int error = 0;
  const ssize_t n = launch_retry([&] { return read(status[0], &error, sizeof error); });
  close(status[0]);
  return {pid, n == static_cast<ssize_t>(sizeof error) ? error : 0};
}

std::string launch_exec_error(const std::string& path, int error) {
  if (error == ENOENT && path.find('/') == std::string::npos)
    return fmt::format("command not found: {} (give its path: launch does not search PATH)",
                       printable(path));
  if (error == ENOENT)
    return fmt::format("command not found: {}", printable(path));
  return fmt::format("cannot run {}: {}", printable(path), strerror(error));
}

} // namespace

LaunchResult launch(const LaunchOptions& options, std::ostream& log) {
  launch_check(options);
  LaunchSignals signals;
  LaunchChildren children;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    const auto [pid, error] = launch_start(options.command, launch_environment(options, local));
    children.exits.push_back({options.node_rank * options.nproc_per_node + local, local, pid});
    children.running.push_back(true);
    if (error != 0) // ~LaunchChildren reaps it and kills the others
      throw std::runtime_error(launch_exec_error(options.command[0], error));
  }

  LaunchResult result;
  std::optional<LaunchClock::time_point> deadline; // the end of the grace period
  std::string grace_after;                         // what started it
  bool grace_over = false;
  const auto start_grace = [&](const std::string& why) {
    if (!deadline) {
      deadline = LaunchClock::now() + options.grace;
      grace_after = why;
    }
  };
  for (;;) {
    for (size_t i = 0; i < children.exits.size(); ++i) {
      RankExit& exit = children.exits[i];
      if (!children.running[i])
        continue;
      siginfo_t info{};
      const int waited =
          launch_retry([&] { return waitid(P_PID, exit.pid, &info, WEXITED | WNOHANG | WNOWAIT); });
      if (waited == 0 && info.si_pid == 0)
        continue; // still running
      // It ended (or is no child of ours any more: ECHILD). Its zombie keeps the pid from
      // being reused, so its group can still be killed by number: what it started goes too.
      kill(-exit.pid, SIGKILL);
      int status = 0;
      const pid_t reaped = launch_retry([&] { return waitpid(exit.pid, &status, 0); });
      children.running[i] = false;
      std::string how;
      if (reaped < 0) {
        exit.exit_code = 1;
        how = "was reaped elsewhere: its exit status is unknown";
      } else if (WIFSIGNALED(status)) {
        exit.signal = WTERMSIG(status);
        exit.exit_code = 128 + exit.signal;
        how = fmt::format("was killed by signal {} ({})", exit.signal,
                          launch_signal_name(exit.signal));
      } else {
        exit.exit_code = WEXITSTATUS(status);
        how = fmt::format("exited with code {}", exit.exit_code);
      }
      if (exit.exit_code == 0)
        continue;
      log << fmt::format("rank {} (pid {}) {}\n", exit.rank, exit.pid, how) << std::flush;
      if (result.first_failed_rank < 0) {
        result.first_failed_rank = exit.rank;
        result.exit_code = exit.exit_code;
      }
      start_grace(fmt::format("rank {} failed", exit.rank));
    }
    const int running = children.count_running();
    if (running == 0)
      break;
    int timeout_ms = -1;
    if (deadline && !grace_over) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*deadline - LaunchClock::now());
      if (left.count() <= 0) {
        log << fmt::format("killing {} rank{} still running {} ms after {}\n", running,
                           running == 1 ? "" : "s", options.grace.count(), grace_after)
            << std::flush;
        children.signal_all(SIGKILL);
        grace_over = true;
      } else {
        timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), INT_MAX));
      }
    }
    pollfd wake{signals.read_fd(), POLLIN, 0};
    if (poll(&wake, 1, timeout_ms) < 0 && errno != EINTR)
      throw std::runtime_error(fmt::format("launch: poll failed: {}", strerror(errno)));
    for (const int signal : signals.drain()) {
      if (signal != SIGINT && signal != SIGTERM)
        continue;
      if (result.stop_signal == 0)
        result.stop_signal = signal;
      const std::string name = launch_signal_name(signal);
      log << fmt::format("forwarding {} to {} rank{}\n", name, children.count_running(),
                         children.count_running() == 1 ? "" : "s")
          << std::flush;
      children.signal_all(signal);
      start_grace(name);
    }
  }
  result.exits = children.exits;
  return result;
}

} // namespace meshsim
