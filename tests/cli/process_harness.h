// Runs made of processes: `meshsim launch ... -- train --backend c10d` and the same run on
// virtual GPUs, for tests/cli/test_cli_processes*.cpp.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dirent.h>

#include <string>
#include <vector>

#include "cli_harness.h"
#include "comm/c10d_backend.h"

namespace meshsim::testing {

/// A TCP port nobody listens on now (the kernel's choice; free again once closed).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// A tiny GPT on synthetic tokens, every step logged: small enough for 4 processes on 2 cores.
/// Tests add --gpus and --max-steps. SGD, as the equivalence tests train
/// (parallel/strategy_harness.h): Adam turns the rounding noise of a gradient that is zero in
/// exact arithmetic (a GPT's key bias) into steps of the learning rate, whose sign the
/// summation order decides.
inline const std::string kProcessGpt =
    "train --model gpt --layers 2 --hidden 32 --heads 4 --seq-len 16 --vocab 64 --data synthetic "
    "--synthetic-train 256 --synthetic-test 32 --batch-size 4 --log-every 1 --optimizer sgd "
    "--lr 0.05 --momentum 0.9 ";

/// `meshsim launch --nproc-per-node N --master-port P [launch_flags] -- TRAIN --backend c10d`.
inline CliResult launch_c10d(int nproc, const std::string& train, const std::string& launch_flags = "",
                             int port = 0) {
  return run_meshsim_exactly(fmt::format("launch --nproc-per-node {} --master-port {} {} -- {} "
                                         "--backend c10d --no-progress",
                                         nproc, port ? port : free_port(), launch_flags, train));
}

/// `command` run by the shell, its stdout and stderr together (an environment set for meshsim
/// alone: `RANK=1 ... meshsim train ...`).
inline CliResult run_command(const std::string& command) {
  CliResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe)
    return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;)
    r.output.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// The processes whose command line mentions `marker` (a run folder): none should outlive
/// their run.
inline std::vector<int> processes_mentioning(const std::string& marker) {
  std::vector<int> found;
  DIR* proc = ::opendir("/proc");
  if (!proc)
    return found;
  while (dirent* e = ::readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == ::getpid())
      continue;
    std::string cmdline = read_text(std::filesystem::path("/proc") / e->d_name / "cmdline");
    std::string stat = read_text(std::filesystem::path("/proc") / e->d_name / "stat");
    const auto close = stat.rfind(')');
    const bool zombie = close != std::string::npos && stat.size() > close + 2 && stat[close + 2] == 'Z';
    if (!zombie && cmdline.find(marker) != std::string::npos)
      found.push_back(pid);
  }
  ::closedir(proc);
  return found;
}

/// The largest relative difference between the tensors of each pair of state_dict files,
/// from PyTorch (tests/cli/compare_state_dicts.py); empty when python3 cannot run it.
inline std::vector<double> state_dict_differences(
    const std::vector<std::pair<std::filesystem::path, std::filesystem::path>>& pairs) {
  std::string cmd = MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR "/tests/cli/compare_state_dicts.py";
  for (const auto& [a, b] : pairs)
    cmd += " " + a.string() + " " + b.string();
  std::string out;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe)
    return {};
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;)
    out.append(buf, n);
  if (pclose(pipe) != 0)
    return {};
  std::vector<double> worst;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    worst.push_back(j.contains("worst") ? j["worst"].get<double>() : 1e300);
  }
  return worst;
}

} // namespace meshsim::testing
