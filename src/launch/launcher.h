// launch(): `meshsim launch`'s process supervisor. Starts one node's processes of a
// multi-process run with torchrun's environment, forwards Ctrl-C and SIGTERM to them, and
// when one fails gives the others a grace period before killing them, so a run never hangs
// on a dead peer and never leaves a process behind. POSIX (Linux: prctl).
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

namespace meshsim {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// argv of every process; command[0] is run with execv (an absolute or relative path, not
  /// looked up in PATH).
  std::vector<std::string> command;
  /// After the first failure, or after forwarding SIGINT/SIGTERM: how long the others get to
  /// exit on their own before SIGKILL.
  std::chrono::milliseconds grace{10000};
};

struct RankExit {
  int rank = -1, local_rank = -1;
  int pid = -1;
  int exit_code = 0; // the process's status; 128 + signal when killed by a signal
  int signal = 0;    // the signal that killed it, 0 if it exited
};

/// "SIGKILL" for 9: the name a person knows the signal by.
std::string launch_signal_name(int signal);

struct LaunchResult {
  int exit_code = 0; // 0 when every rank exited 0; else the first failing rank's exit_code
  int first_failed_rank = -1;
  int stop_signal = 0; // the first SIGINT or SIGTERM the launcher was sent and forwarded (0: none)
  std::vector<RankExit> exits; // one per local process, by local rank
};

/// Starts nproc_per_node processes of `command`, global ranks node_rank * nproc_per_node +
/// local, each with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
/// GROUP_RANK, MASTER_ADDR, MASTER_PORT) replacing those of the launcher's own environment.
///
/// Forwards SIGINT and SIGTERM that the process receives to every child's process group, and
/// gives them `grace` to exit before SIGKILL. When a child fails (nonzero exit or a signal),
/// writes one line to `log` naming the rank, pid and how it ended ("rank 2 (pid 1234) was
/// killed by signal 9 (SIGKILL)", "rank 1 (pid 99) exited with code 5"), gives the others
/// `grace` to exit on their own (they are expected to notice through their communicator
/// timeouts), then SIGKILLs the process groups of any left. Returns when every child is gone.
///
/// Leaves no process behind: each child is its own process-group leader, its group is killed
/// when it ends (so a child's own children go with it, unless they left the group), and each
/// child gets prctl(PR_SET_PDEATHSIG, SIGKILL), so it dies if the calling thread does (the
/// launcher killed outright).
///
/// While it runs, launch() owns SIGCHLD, SIGINT and SIGTERM: it installs its own handlers
/// (whichever thread a signal lands on) and unblocks them in the calling thread, and restores
/// the handlers and mask on return. Only one launch() at a time per process: a second one
/// while the first runs throws std::logic_error.
///
/// Throws std::invalid_argument (one line) for bad options (nproc_per_node < 1, nnodes < 1,
/// node_rank outside [0, nnodes), an empty command or master address, a port outside
/// 1..65535, a negative grace) and std::runtime_error when a process cannot be started (the
/// command not found, named; the children already started are killed and reaped first).
LaunchResult launch(const LaunchOptions& options, std::ostream& log);

} // namespace meshsim
