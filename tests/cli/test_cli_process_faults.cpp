// Faults in a run made of processes: a rank killed mid-run (kill -9, by itself or from
// outside) or hung (SIGSTOP) makes the others exit 5 within the collective timeout, naming
// it, and `meshsim launch` names it and exits with the first failing rank's code; a port in
// use, a wrong world size, a missing rank 0 or no launcher at all are one line and exit 2.
// No process outlives its run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <regex>
#include <thread>

#include "process_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

#define SKIP_WITHOUT_C10D()                                                                        \
  if (!meshsim::c10d_available())                                                                 \
  GTEST_SKIP() << "this build has no c10d backend (its LibTorch has no Gloo headers)"

} // namespace

TEST(CliProcessFaults, AKilledRankMakesTheOthersExit5NamingIt) {
  SKIP_WITHOUT_C10D();
  const fs::path out = fresh_dir("c10d-kill9");
  const auto start = std::chrono::steady_clock::now();
  // --inject-fault 2:3: at step 3 rank 2's process sends itself SIGKILL.
  const auto r = launch_c10d(4, kProcessGpt + "--gpus 4 --max-steps 8 --comm-timeout 20 --inject-fault 2:3 "
                                              "--out " + out.string(),
                             "--grace 30");
  const double took = seconds_since(start);
  EXPECT_EQ(r.code, 128 + 9) << r.output;  // the first rank to fail: killed by signal 9
  EXPECT_NE(r.output.find("meshsim launch: rank 2 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9"), std::string::npos) << r.output;
  // Every other rank saw it go, said which rank it was, and exited 5.
  for (int rank : {0, 1, 3}) {
    EXPECT_TRUE(std::regex_search(r.output, std::regex("meshsim launch: rank " + std::to_string(rank) +
                                                       R"( \(pid \d+\) exited with code 5)")))
        << "rank " << rank << "\n" << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("meshsim: rank " + std::to_string(rank) +
                                                       ": .*rank 2 went silent")))
        << "rank " << rank << "\n" << r.output;
  }
  EXPECT_LT(took, 20.0) << "the others should fail within --comm-timeout";
  EXPECT_TRUE(processes_mentioning(out.string()).empty()) << "a process outlived the run";
}

TEST(CliProcessFaults, APortInUseIsExit2) {
  SKIP_WITHOUT_C10D();
  // Something listens on the port: launch refuses before starting anything, and so does a
  // rank 0 started by another launcher (torchrun's variables set by hand).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const fs::path out = fresh_dir("c10d-port");
  auto r = launch_c10d(2, kProcessGpt + "--gpus 2 --max-steps 2 --out " + out.string(), "", port);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("port " + std::to_string(port) + " is already in use"), std::string::npos)
      << r.output;
  r = run_command(fmt::format("RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT={} {} {} "
                              "--gpus 1 --max-steps 2 --backend c10d --no-progress --out {}",
                              port, MESHSIM_BINARY, kProcessGpt, out.string()));
  ::close(fd);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("already in use"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(CliProcessFaults, AWrongWorldSizeIsExit2) {
  SKIP_WITHOUT_C10D();
  const fs::path out = fresh_dir("c10d-world");
  const auto start = std::chrono::steady_clock::now();
  const auto r = launch_c10d(2, kProcessGpt + "--gpus 4 --max-steps 2 --out " + out.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("WORLD_SIZE is 2 but --gpus is 4"), std::string::npos) << r.output;
  EXPECT_LT(seconds_since(start), 30.0);
  EXPECT_TRUE(processes_mentioning(out.string()).empty());
}

TEST(CliProcessFaults, ARankWithoutRankZeroGivesUpWithinTheTimeout) {
  SKIP_WITHOUT_C10D();
  // Rank 1 of 2, and nobody serves the rendezvous: a stale address, or rank 0 never started.
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_command(fmt::format(
      "RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={} {} {} --gpus 2 --max-steps 2 "
      "--backend c10d "
      "--comm-timeout 3 --no-progress",
      free_port(), MESHSIM_BINARY, kProcessGpt));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("rank 1 cannot reach the rendezvous at 127.0.0.1:"), std::string::npos)
      << r.output;
  EXPECT_LT(seconds_since(start), 20.0) << r.output;
}

TEST(CliProcessFaults, AWorldSizeThatDisagreesAndARankTakenTwiceAreExit2) {
  SKIP_WITHOUT_C10D();
  // Rank 0 of 2 serves the rendezvous. A rank 1 told the world has 3 ranks is refused; a
  // second rank 1 finds the rank taken (the first one's claim stands: a stale run, or two
  // processes given the same RANK); rank 0, whose rank 1 never joined, gives up within
  // --comm-timeout. Every one of them in one line, exit 2.
  const fs::path out = fresh_dir("c10d-claims");
  const fs::path logs = fresh_dir("c10d-claims-logs");
  const std::string rank = fmt::format(
      "MASTER_ADDR=127.0.0.1 MASTER_PORT={} {} {} --backend c10d --no-progress --max-steps 2 "
      "--comm-timeout 5 --out {}",
      free_port(), MESHSIM_BINARY, kProcessGpt, out.string());
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_command(fmt::format(
      "(mkdir -p {1}; RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 {0} --gpus 2 > {1}/rank0.log 2>&1 & zero=$!; "
      "RANK=1 LOCAL_RANK=1 WORLD_SIZE=3 {0} --gpus 3; echo \"first rank 1: $?\"; "
      "RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 {0} --gpus 2; echo \"second rank 1: $?\"; "
      "wait $zero; echo \"rank 0: $?\"; cat {1}/rank0.log)",
      rank, logs.string()));
  EXPECT_NE(r.output.find("WORLD_SIZE is 3 on rank 1 but 2 on rank 0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("first rank 1: 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 is already taken at the rendezvous"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("second rank 1: 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 did not join the rendezvous"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0: 2"), std::string::npos) << r.output;
  EXPECT_LT(seconds_since(start), 30.0) << r.output;
}

TEST(CliProcessFaults, C10dWithoutALauncherSaysHowToStartIt) {
  const auto r = run_command("env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID " +
                             std::string(MESHSIM_BINARY) + " " + kProcessGpt +
                             "--gpus 2 --backend c10d --no-progress");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("start it with `meshsim launch"), std::string::npos) << r.output;
}

namespace {

// The pid of rank `rank`'s process of the run writing to `out` (its environment says RANK),
// or with rank -1 of the launcher; 0 when there is none.
int rank_pid(const fs::path& out, int rank) {
  for (int pid : processes_mentioning(out.string())) {
    std::string env = read_text(fs::path("/proc") / std::to_string(pid) / "environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    std::string cmd = read_text(fs::path("/proc") / std::to_string(pid) / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const bool launcher = cmd.find(" launch ") != std::string::npos &&
                          cmd.rfind("bash", 0) != 0 && cmd.rfind("sh ", 0) != 0;
    if (rank < 0 ? launcher
                 : !launcher && ("\n" + env).find("\nRANK=" + std::to_string(rank) + "\n") !=
                                    std::string::npos)
      return pid;
  }
  return 0;
}

// Starts a 4-process run in the background, and once it has trained a step sends rank 1's
// process (or with `rank` -1 the launcher) `signal` from outside; returns launch's output and
// exit code. A run still going 60 s after it started is a failure, and its processes are
// killed (the background shell holds none of the test's output, so nothing waits on it).
// launch's --grace, after the first rank's exit, outlasts --comm-timeout 5 by default, so the
// others find the failure themselves.
CliResult signal_mid_run(const fs::path& out, int signal, int rank = 1, int grace_s = 10) {
  fs::create_directories(out.parent_path());
  const fs::path log = out.string() + ".log", rc = out.string() + ".rc";
  const std::string command = fmt::format(
      "( {} launch --nproc-per-node 4 --master-port {} --grace {} -- {} --gpus 4 --max-steps "
      "100000 --comm-timeout 5 --backend c10d --no-progress --out {} > {} 2>&1; echo $? > {} ) "
      "> /dev/null 2>&1 &",
      MESHSIM_BINARY, free_port(), grace_s, kProcessGpt, out.string(), log.string(), rc.string());
  std::system(command.c_str());
  // Polls the run folder: the test's own wait, bounded, for a run of other processes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int pid = 0;
  while (std::chrono::steady_clock::now() < deadline &&
         (pid == 0 || read_text(out / "metrics.jsonl").empty())) {
    pid = rank_pid(out, rank);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(pid, 0) << "rank " << rank << "'s process never appeared\n" << read_text(log);
  if (pid > 0)
    ::kill(pid, signal);
  while (std::chrono::steady_clock::now() < deadline && read_text(rc).empty())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CliResult r;
  r.output = read_text(log);
  const std::string code = read_text(rc);
  r.code = code.empty() ? -1 : std::stoi(code);
  if (code.empty()) { // the run outlived the test's wait: end it, and say so
    ADD_FAILURE() << "launch had not exited 60 s after the run started\n" << r.output;
    for (const int left : processes_mentioning(out.string())) {
      ::kill(left, SIGKILL);
      ::kill(left, SIGCONT);
    }
  }
  return r;
}

} // namespace

TEST(CliProcessFaults, KillNineFromOutsideIsNamedByLaunchAndTheOthers) {
  SKIP_WITHOUT_C10D();
  const fs::path out = fresh_dir("c10d-external-kill") / "run";
  const auto start = std::chrono::steady_clock::now();
  const auto r = signal_mid_run(out, SIGKILL);
  EXPECT_EQ(r.code, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("meshsim launch: rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(meshsim: rank 0: .*rank 1 went silent)")))
      << r.output;
  EXPECT_LT(seconds_since(start), 60.0);
  EXPECT_TRUE(processes_mentioning(out.string()).empty()) << "a process outlived the run";
}

TEST(CliProcessFaults, AHungRankMakesTheOthersExit5WithinTheTimeout) {
  SKIP_WITHOUT_C10D();
  // SIGSTOP: the process stays, silent, as a hung one would; launch kills it after --grace,
  // which starts when the first of the others has timed out (they wait on the same step's
  // collective, so the rest follow within it).
  const fs::path out = fresh_dir("c10d-hang") / "run";
  const auto r = signal_mid_run(out, SIGSTOP, 1, 3);
  EXPECT_EQ(r.code, 5) << r.output;
  for (int rank : {0, 2, 3})
    EXPECT_TRUE(std::regex_search(r.output, std::regex("meshsim: rank " + std::to_string(rank) +
                                                       ": .*rank 1 went silent")))
        << "rank " << rank << "\n" << r.output;
  EXPECT_NE(r.output.find("meshsim launch: rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_TRUE(processes_mentioning(out.string()).empty()) << "a process outlived the run";
}

TEST(CliProcessFaults, SigtermToLaunchStopsEveryRankAfterTheSameStep) {
  SKIP_WITHOUT_C10D();
  // launch forwards SIGTERM to every rank; they agree through the store on the step to stop
  // after, write their parts and a checkpoint, and rank 0 merges the run folder.
  const fs::path out = fresh_dir("c10d-sigterm") / "run";
  const auto r = signal_mid_run(out, SIGTERM, -1);
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.output;
  const auto summary = read_json(out / "summary.json");
  EXPECT_EQ(summary["status"], "interrupted") << r.output;
  EXPECT_EQ(summary["gpus"].size(), 4u);
  // The step the ranks stopped after ran on every rank; metrics.jsonl has the steps before it
  // (a stop is decided after a step's loss, before it is logged, as in one process).
  const size_t steps = summary["steps"].get<size_t>();
  EXPECT_GE(steps, 1u);
  EXPECT_EQ(run_losses(out).size() + 1, steps);
  EXPECT_TRUE(fs::exists(out / "checkpoint" / "latest")) << r.output;
  EXPECT_EQ(r.output.find("killing"), std::string::npos) << "ranks did not stop by themselves\n"
                                                         << r.output;
  // The stop asked for is said as such, not as a rank's failure.
  EXPECT_NE(r.output.find("stopped by SIGTERM"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("failed first"), std::string::npos) << r.output;
  EXPECT_TRUE(processes_mentioning(out.string()).empty()) << "a process outlived the run";
}

// Two launches of one run whose train flags differ (a node started by hand with other flags)
// stop at the rendezvous, before anything trains, every process saying which field differs.
// Before, a different --hidden crashed inside Gloo and a different --optimizer trained two
// optimizers and said ok.
TEST(CliProcessFaults, ProcessesStartedWithDifferentConfigurationsStopBeforeTraining) {
  SKIP_WITHOUT_C10D();
  const fs::path base = fresh_dir("c10d-differ");
  fs::create_directories(base);
  const struct {
    std::string node1, field;
  } cases[] = {
      {"--hidden 64", "gpt.hidden is 64 on rank 2 and 32 on rank 0"},
      {"--max-steps 5", "max_steps is 5 on rank 2 and 3 on rank 0"},
      {"--optimizer adam", "optimizer is \"adam\" on rank 2 and \"sgd\" on rank 0"},
      {"--gpu-mem 1GiB", "gpu_mem is \"1GiB\" on rank 2 and \"auto\" on rank 0"},
      {"--out " + (base / "elsewhere").string(), "out is"},
  };
  // kProcessGpt and the run's own flags, each replaced by `override`'s value where it gives one.
  auto flags = [&](const fs::path& out, const std::string& override) {
    std::istringstream words(kProcessGpt + "--gpus 4 --max-steps 3 --comm-timeout 20 --out " + out.string());
    std::string text, flag, value;
    words >> text; // "train", then flag-value pairs
    while (words >> flag >> value)
      if (override.find(flag + " ") == std::string::npos) text += " " + flag + " " + value;
    return text + " " + override;
  };
  int i = 0;
  for (const auto& c : cases) {
    const fs::path out = base / ("run" + std::to_string(i++));
    const int port = free_port();
    auto command = [&](int node, const std::string& override) {
      return fmt::format("{} launch --nproc-per-node 2 --nnodes 2 --node-rank {} --master-port {} "
                         "-- {} --backend c10d --no-progress > {}.node{}.log 2>&1",
                         MESHSIM_BINARY, node, port, flags(out, override), out.string(), node);
    };
    const std::string both = "( " + command(1, c.node1) + " ; echo $? > " + out.string() +
                             ".node1.rc ) & " + command(0, "") + "; rc=$?; wait; exit $rc";
    const auto start = std::chrono::steady_clock::now();
    const int status = std::system(("bash -c '" + both + "'").c_str());
    const std::string log0 = read_text(out.string() + ".node0.log");
    const std::string log1 = read_text(out.string() + ".node1.log");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log0;
    EXPECT_EQ(read_text(out.string() + ".node1.rc"), "2\n") << log1;
    for (const std::string& log : {log0, log1}) {
      EXPECT_NE(log.find("started with different configurations: " + c.field), std::string::npos)
          << c.node1 << "\n" << log;
      EXPECT_EQ(log.find("gloo"), std::string::npos) << log;
    }
    EXPECT_FALSE(fs::exists(out / "metrics.jsonl")) << "a process trained";
    EXPECT_LT(seconds_since(start), 60.0);
  }
}

// --gpu-mem auto: processes started at different moments see different free memory; all of
// them take the smallest share, so every GPU of the run has one capacity.
TEST(CliProcessFaults, GpuMemAutoGivesEveryProcessTheSameCapacity) {
  SKIP_WITHOUT_C10D();
  const fs::path out = fresh_dir("c10d-auto") / "run";
  const auto r = launch_c10d(4, kProcessGpt + "--gpus 4 --max-steps 1 --gpu-mem auto --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto gpus = read_json(out / "summary.json")["gpus"];
  ASSERT_EQ(gpus.size(), 4u);
  for (const auto& g : gpus)
    EXPECT_EQ(g["capacity_bytes"], gpus[0]["capacity_bytes"]) << gpus.dump();
}
