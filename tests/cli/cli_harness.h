// Runs the meshsim binary as a user would and captures its exit code and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/command_line.h"

namespace meshsim::testing {

// True in `make sanitize`'s builds: instrumented at -O1, several times slower, with shadow
// memory. (The browser test, a Python script, gets MESHSIM_TEST_SLOWDOWN from CMake instead.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif

struct CliResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Everything left to read from `file`.
inline std::string read_all(FILE* file) {
  std::string all;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), file)) > 0;) all.append(buf.data(), n);
  return all;
}

// Runs `meshsim ARGS` exactly as given (run_meshsim adds --no-progress, which only `train`
// takes).
inline CliResult run_meshsim_exactly(const std::string& args) {
  // The suite's CPU expectations hold on a GPU machine too: a command runs on the CPU unless
  // it asks for the card itself.
  const std::string hide_gpu =
      args.find("--device cuda") == std::string::npos ? "CUDA_VISIBLE_DEVICES= " : "";
  const std::string cmd = hide_gpu + std::string(MESHSIM_BINARY) + " " + args + " 2>&1";
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  r.output = read_all(pipe);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CliResult run_meshsim(const std::string& args) {
  return run_meshsim_exactly(args + " --no-progress");
}

// Runs `meshsim ARGS` as run_meshsim_exactly does, inside this test process: main()'s own work
// (run_main), with this process's stdout and stderr sent to a file while it runs. A new process
// spends 0.4 s of CPU loading LibTorch before it reads a flag; the tests that sweep hundreds of
// refusals value by value run them here, and CliBadInput.InProcessAnswersAsTheBinaryDoes holds
// the two ways to the same codes and lines. ARGS is split at spaces: no quotes, no shell.
inline CliResult run_meshsim_in_process_exactly(const std::string& args) {
  std::vector<std::string> words = {MESHSIM_BINARY}; // as the binary, started by its path
  std::istringstream split(args);
  for (std::string word; split >> word;) {
    EXPECT_EQ(word.find_first_of("\"'$`"), std::string::npos)
        << "run_meshsim_in_process takes no shell syntax: " << args;
    words.push_back(word);
  }
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);

  // Restores stdout and stderr however run_main returns.
  struct Capture {
    FILE* file = std::tmpfile();
    int out = -1, err = -1;
    static void flush() {
      std::cout.flush();
      std::cerr.flush();
      std::fflush(stdout);
      std::fflush(stderr);
    }
    Capture() {
      flush();
      out = ::dup(1);
      err = ::dup(2);
      ::dup2(::fileno(file), 1);
      ::dup2(::fileno(file), 2);
    }
    ~Capture() {
      flush();
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::close(out);
      ::close(err);
      std::fclose(file);
    }
    std::string text() {
      flush();
      std::rewind(file);
      return read_all(file);
    }
  };
  CliResult r;
  Capture capture;
  r.code = meshsim::run_main(static_cast<int>(words.size()), argv.data());
  r.output = capture.text();
  return r;
}

inline CliResult run_meshsim_in_process(const std::string& args) {
  return run_meshsim_in_process_exactly(args + " --no-progress");
}

// memory.png is drawn by gnuplot, which `make` installs; a machine without it (a GPU machine's
// bare image) writes every other file of the run folder and says why the picture is missing.
inline bool picture_expected() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// The folders fresh_dir made in this test process. They are removed when the process ends
// with every test passed, and kept to be looked at when one failed.
class TestDirs {
public:
  static TestDirs& instance() {
    static TestDirs dirs; // made after gtest's UnitTest, so destroyed before it
    return dirs;
  }
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(dir);
  }
  ~TestDirs() {
    if (!::testing::UnitTest::GetInstance()->Passed())
      return;
    for (const auto& dir : dirs_) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

private:
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};

// A small synthetic training run; tests add the layout and the run folder.
inline const std::string kSmallTrain =
    "train --data synthetic --synthetic-train 512 --synthetic-test 128 ";

inline std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("meshsim-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  TestDirs::instance().add(dir);
  return dir;
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The loss of every step a run folder's metrics.jsonl logged, in order.
inline std::vector<double> run_losses(const std::filesystem::path& run) {
  std::istringstream metrics(read_text(run / "metrics.jsonl"));
  std::vector<double> out;
  for (std::string line; std::getline(metrics, line);)
    out.push_back(nlohmann::json::parse(line)["loss"]);
  return out;
}

} // namespace meshsim::testing
