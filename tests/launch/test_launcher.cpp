// Tests for launch(): every rank gets torchrun's environment, the first failing rank decides
// the exit code, the others are killed after the grace period, SIGTERM is forwarded, nothing
// is left running (children, their children, or children of a launcher killed outright), and
// bad options and missing commands are refused in one line. The ranks are /bin/sh scripts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../train/error_of.h"
#include "launch/launcher.h"

namespace meshsim {
namespace {

using testing::error_of;
namespace launch_fs = std::filesystem;
using LaunchTestClock = std::chrono::steady_clock;

/// A fresh directory for the ranks' files, removed with everything in it.
struct LaunchTestDir {
  launch_fs::path path;
  LaunchTestDir() {
    static std::atomic<int> n{0};
    path = launch_fs::temp_directory_path() /
           ("meshsim-launch-test-" + std::to_string(getpid()) + "-" + std::to_string(n++));
    launch_fs::remove_all(path);
    launch_fs::create_directories(path);
  }
  ~LaunchTestDir() {
    std::error_code ec;
    launch_fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string launch_test_read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

LaunchOptions launch_test_options(int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.command = {"/bin/sh", "-c", script};
  return o;
}

/// True once `pid` (not a child of this process) is gone or a zombie nobody reaps, within 5 s.
bool launch_test_ends(int pid) {
  const auto deadline = LaunchTestClock::now() + std::chrono::seconds(5);
  while (LaunchTestClock::now() < deadline) {
    if (kill(pid, 0) != 0 && errno == ESRCH)
      return true;
    const std::string stat = launch_test_read("/proc/" + std::to_string(pid) + "/stat");
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && stat.compare(paren, 3, ") Z") == 0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

/// True once every file in `paths` exists, within 10 s.
bool launch_test_all_exist(const std::vector<std::string>& paths) {
  const auto deadline = LaunchTestClock::now() + std::chrono::seconds(10);
  while (LaunchTestClock::now() < deadline) {
    bool all = true;
    for (const auto& p : paths)
      all = all && launch_fs::exists(p);
    if (all)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

void expect_reaped(const LaunchResult& result) {
  for (const RankExit& exit : result.exits) {
    ASSERT_GT(exit.pid, 0);
    EXPECT_EQ(kill(exit.pid, 0), -1) << "rank " << exit.rank << " is still there";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(Launcher, EveryRankGetsTorchrunsEnvironment) {
  LaunchTestDir dir;
  setenv("RANK", "99", 1); // the launcher's own, replaced
  setenv("MESHSIM_LAUNCH_TEST_MARK", "kept", 1);
  LaunchOptions o = launch_test_options(
      3, "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
         "$MASTER_PORT $MESHSIM_LAUNCH_TEST_MARK \"$1\" > '" +
             dir.file("") + "'$LOCAL_RANK");
  o.command.push_back("sh");
  o.command.push_back("one argument");
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 12345;
  std::ostringstream log;
  const LaunchResult result = launch(o, log);
  unsetenv("RANK");
  unsetenv("MESHSIM_LAUNCH_TEST_MARK");

  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.first_failed_rank, -1);
  EXPECT_EQ(log.str(), "");
  ASSERT_EQ(result.exits.size(), 3u);
  for (int local = 0; local < 3; ++local) {
    EXPECT_EQ(result.exits[local].rank, 3 + local);
    EXPECT_EQ(result.exits[local].local_rank, local);
    EXPECT_EQ(result.exits[local].exit_code, 0);
    EXPECT_EQ(launch_test_read(dir.file(std::to_string(local))),
              std::to_string(3 + local) + " 6 " + std::to_string(local) +
                  " 3 1 10.1.2.3 12345 kept one argument\n");
  }
  expect_reaped(result);
}

TEST(Launcher, FirstFailingRankSetsTheExitCode) {
  std::ostringstream log;
  const LaunchResult result =
      launch(launch_test_options(4, "if [ $RANK = 2 ]; then exit 7; fi; exit 0"), log);
  EXPECT_EQ(result.exit_code, 7);
  EXPECT_EQ(result.first_failed_rank, 2);
  ASSERT_EQ(result.exits.size(), 4u);
  EXPECT_EQ(result.exits[2].exit_code, 7);
  EXPECT_EQ(result.exits[2].signal, 0);
  EXPECT_EQ(result.exits[0].exit_code, 0);
  EXPECT_EQ(log.str(),
            "rank 2 (pid " + std::to_string(result.exits[2].pid) + ") exited with code 7\n");
  expect_reaped(result);
}

TEST(Launcher, KilledRankEndsTheOthersAfterGrace) {
  LaunchOptions o = launch_test_options(3, "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 30");
  o.grace = std::chrono::milliseconds(300);
  std::ostringstream log;
  const auto start = LaunchTestClock::now();
  const LaunchResult result = launch(o, log);
  const auto took = LaunchTestClock::now() - start;

  EXPECT_EQ(result.exit_code, 128 + SIGKILL);
  EXPECT_EQ(result.first_failed_rank, 1);
  ASSERT_EQ(result.exits.size(), 3u);
  for (const RankExit& exit : result.exits)
    EXPECT_EQ(exit.signal, SIGKILL) << "rank " << exit.rank;
  EXPECT_GE(took, o.grace);
  EXPECT_LT(took, std::chrono::seconds(10));
  const std::string pid = std::to_string(result.exits[1].pid);
  EXPECT_EQ(log.str().rfind("rank 1 (pid " + pid +
                                ") was killed by signal 9 (SIGKILL)\n"
                                "killing 2 ranks still running 300 ms after rank 1 failed\n",
                            0),
            0u)
      << log.str();
  expect_reaped(result);
}

TEST(Launcher, ChildrenOfARankGoWithIt) {
  LaunchTestDir dir;
  const LaunchResult result = launch(
      launch_test_options(1, "sleep 30 & echo $! > '" + dir.file("background") + "'"), std::cerr);
  EXPECT_EQ(result.exit_code, 0);
  const int background = std::stoi(launch_test_read(dir.file("background")));
  EXPECT_TRUE(launch_test_ends(background)) << "pid " << background;
}

std::atomic<int> launch_test_own_handler_ran{0};
void launch_test_own_handler(int) {
  launch_test_own_handler_ran = 1;
}

TEST(Launcher, TerminationIsForwardedToEveryRank) { // and a second launch is refused
  struct sigaction own = {}, before = {}, after = {};
  own.sa_handler = launch_test_own_handler;
  sigemptyset(&own.sa_mask);
  sigaction(SIGTERM, &own, &before);
  LaunchTestDir dir;
  LaunchOptions o = launch_test_options(2, "touch '" + dir.file("") + "'$RANK; exec sleep 30");
  o.grace = std::chrono::seconds(20);
  std::thread terminate([&] {
    const bool started = launch_test_all_exist({dir.file("0"), dir.file("1")});
    EXPECT_TRUE(started);
    if (started) {
      EXPECT_THROW(launch(o, std::cerr), std::logic_error) << "one launch at a time";
    }
    kill(getpid(), SIGTERM); // outside launch(), `own` would catch it
  });
  std::ostringstream log;
  const auto start = LaunchTestClock::now();
  const LaunchResult result = launch(o, log);
  const auto took = LaunchTestClock::now() - start;
  terminate.join();
  sigaction(SIGTERM, &before, &after);

  EXPECT_EQ(after.sa_handler, launch_test_own_handler) << "launch put its handler back";
  EXPECT_EQ(launch_test_own_handler_ran.load(), 0);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM);
  ASSERT_EQ(result.exits.size(), 2u);
  for (const RankExit& exit : result.exits)
    EXPECT_EQ(exit.signal, SIGTERM) << "rank " << exit.rank;
  EXPECT_LT(took, std::chrono::seconds(10)) << "well before the grace period's SIGKILL";
  EXPECT_EQ(log.str().rfind("forwarding SIGTERM to 2 ranks\n", 0), 0u) << log.str();
  expect_reaped(result);
}

TEST(Launcher, RanksDieWithTheLauncher) {
  LaunchTestDir dir;
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) { // the launcher, to be killed outright
    const std::string rank_file = "'" + dir.file("") + "'$RANK";
    try {
      launch(launch_test_options(2, "echo $$ > " + rank_file + ".tmp; mv " + rank_file + ".tmp " +
                                        rank_file + "; exec sleep 30"),
             std::cerr);
    } catch (...) {
    }
    _exit(0);
  }
  const bool started = launch_test_all_exist({dir.file("0"), dir.file("1")});
  kill(launcher, SIGKILL);
  waitpid(launcher, nullptr, 0);
  ASSERT_TRUE(started);
  for (const char* rank : {"0", "1"}) {
    const int pid = std::stoi(launch_test_read(dir.file(rank)));
    EXPECT_TRUE(launch_test_ends(pid)) << "rank " << rank << " (pid " << pid << ")";
  }
}

TEST(Launcher, MissingCommandIsNamed) {
  LaunchOptions o;
  o.nproc_per_node = 3;
  o.command = {"/nonexistent/meshsim-launch-test"};
  try {
    launch(o, std::cerr);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "command not found: /nonexistent/meshsim-launch-test");
  }
  o.command = {"sh"};
  try {
    launch(o, std::cerr);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "command not found: sh (give its path: launch does not search PATH)");
  }
  LaunchTestDir dir;
  std::ofstream(dir.file("plain")) << "exit 0\n"; // not executable
  o.command = {dir.file("plain")};
  try {
    launch(o, std::cerr);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot run " + dir.file("plain") + ": Permission denied");
  }
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "a failed rank was left unreaped";
}

TEST(Launcher, BadOptionsAreRefused) {
  const auto refusal = [](void (*change)(LaunchOptions&)) {
    LaunchOptions o = launch_test_options(2, "exit 0");
    change(o);
    return error_of([&] { launch(o, std::cerr); });
  };
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.nproc_per_node = 0; }),
            "--nproc-per-node must be at least 1, got 0");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.nnodes = 0; }), "--nnodes must be at least 1, got 0");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.nnodes = 2, o.node_rank = 2; }),
            "--node-rank 2 is outside [0, 2) for --nnodes 2");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.node_rank = -1; }),
            "--node-rank -1 is outside [0, 1) for --nnodes 1");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.command.clear(); }), "launch needs a command to run");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.master_port = 0; }),
            "--master-port 0 is outside 1..65535");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.master_port = 65536; }),
            "--master-port 65536 is outside 1..65535");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.master_addr.clear(); }), "--master-addr is empty");
  EXPECT_EQ(refusal([](LaunchOptions& o) { o.grace = std::chrono::milliseconds(-1); }),
            "the grace period must not be negative, got -1 ms");
}

} // namespace
} // namespace meshsim
