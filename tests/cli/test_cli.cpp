// Golden tests of `meshsim train`: the run folder's contract and the exit codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "cli_harness.h"
#include "report/tensorboard.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

TEST(CliRun, RunFolderHasTheContractedFiles) {
  const auto out = fresh_dir("golden");
  auto r = run_meshsim(kSmallTrain + "--gpus 2 --batch-size 16 --max-steps 6 --log-every 2 --out " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* f : {"config.json", "metrics.jsonl", "memory.csv", "summary.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  if (picture_expected()) {
    EXPECT_TRUE(fs::exists(out / "memory.png"));
  }

  const auto s = read_json(out / "summary.json");
  for (const char* key : {"world_size", "strategy", "device", "steps", "wall_seconds",
                          "train_seconds", "final_loss", "test_accuracy", "gpus"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["steps"], 6);
  EXPECT_LE(s["train_seconds"].get<double>(), s["wall_seconds"].get<double>());
  ASSERT_EQ(s["gpus"].size(), 2u);
  for (const auto& g : s["gpus"]) {
    for (const char* key : {"rank", "capacity_bytes", "peak_bytes", "peak_by_category"})
      EXPECT_TRUE(g.contains(key)) << key;
    for (const char* c : {"parameters", "gradients", "optimizer", "activations", "communication", "other"})
      EXPECT_TRUE(g["peak_by_category"].contains(c)) << c;
    EXPECT_EQ(g["peak_by_category"]["parameters"], 4 * 421642);
  }

  std::istringstream metrics(read_text(out / "metrics.jsonl"));
  std::string line;
  std::vector<int> steps;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("epoch") && j.contains("loss"));
    steps.push_back(j["step"]);
  }
  EXPECT_EQ(steps, (std::vector<int>{2, 4, 6}));

  const std::string csv = read_text(out / "memory.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "time_s,step,phase,gpu0_mib,gpu1_mib,phys_used_mib,phys_util_pct");
  // A CPU run has no card reading: the last two cells of every row are empty.
  std::istringstream rows(csv.substr(csv.find('\n') + 1));
  int row_count = 0;
  while (std::getline(rows, line)) {
    ++row_count;
    EXPECT_EQ(line.substr(line.size() - 2), ",,") << line;
  }
  EXPECT_GT(row_count, 0);

  fs::path events;
  for (const auto& e : fs::directory_iterator(out / "tb")) events = e.path();
  auto scalars = meshsim::read_tensorboard_scalars(events);
  int losses = 0;
  for (const auto& sc : scalars) losses += sc.tag == "train/loss";
  EXPECT_EQ(losses, 3);
  fs::remove_all(out);
}

TEST(CliErrors, BadInputIsOneLineAndExitCode2Or3) {
  const struct {
    std::string args;
    int code;
    std::string says;
  } cases[] = {
      {"train --gpus 0", 2, "--gpus"},
      {"train --batch-size 0", 2, "--batch-size"},
      {"train --model resnet", 2, "unknown model 'resnet'"},
      {"train --model resnet50 --data data/fashion", 2, "only --data synthetic makes them"},
      {"train --model resnet50 --synthetic-train 100000000", 2, "synthetic 3×224×224 images take"},
      {"train --strategy fsdp9", 2, "unknown strategy 'fsdp9'"},
      {"train --gpu-mem lots", 2, "--gpu-mem"},
      {"train --gpus many", 2, "--gpus"},
      {"train --data /nonexistent/folder", 3, "data folder not found"},
      {"frobnicate", 2, ""},
  };
  for (const auto& c : cases) {
    auto r = run_meshsim(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
}

// A flag's error points at the help of the subcommand it was given to, nested ones included,
// and that help exists.
TEST(CliErrors, AFlagErrorPointsAtItsOwnSubcommandsHelp) {
  for (const auto& [args, command] : std::vector<std::pair<std::string, std::string>>{
           {"", ""},
           {"train --gpus many", "train"},
           {"plan --frobnicate", "plan"},
           {"validate --only nothing", "validate"},
           {"models --frobnicate", "models"},
           {"info --frobnicate", "info"},
           {"bench comm --frobnicate", "bench comm"},
           {"bench", "bench"},
           {"launch --frobnicate", "launch"}}) {
    const std::string help = command.empty() ? "meshsim" : "meshsim " + command;
    const auto r = run_meshsim_in_process_exactly(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("(see " + help + " --help)\n"), std::string::npos)
        << args << "\n" << r.output;
    EXPECT_EQ(run_meshsim_in_process_exactly(command + " --help").code, 0) << help;
  }
}

TEST(CliErrors, TruncatedDataFileIsExitCode3) {
  const auto dir = fresh_dir("truncated");
  fs::create_directories(dir);
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::ofstream(dir / f, std::ios::binary) << std::string("\x00\x00\x08\x03\x00\x00", 6);
  }
  auto r = run_meshsim("train --data " + dir.string());
  EXPECT_EQ(r.code, 3) << r.output;
  fs::remove_all(dir);
}

TEST(CliErrors, OutOfMemoryIsExitCode4AndKeepsTheRunFolder) {
  const auto out = fresh_dir("oom");
  auto r = run_meshsim(kSmallTrain + "--gpus 2 --gpu-mem 1MiB --out " + out.string());
  EXPECT_EQ(r.code, 4) << r.output;
  for (const char* says : {"out of memory on gpu", "tried to allocate", "parameters", "capacity 1.0 MiB"})
    EXPECT_NE(r.output.find(says), std::string::npos) << says << "\n" << r.output;
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_TRUE(fs::exists(out / "memory.csv"));
  const auto s = read_json(out / "summary.json");
  EXPECT_EQ(s["status"], "failed");
  EXPECT_EQ(s["exit_code"], 4);
  fs::remove_all(out);
}

TEST(CliErrors, RankThatSkipsACollectiveIsExitCode5WithinTheTimeout) {
  const auto out = fresh_dir("fault");
  const auto start = std::chrono::steady_clock::now();
  auto r = run_meshsim(kSmallTrain + "--gpus 4 --batch-size 8 --max-steps 10 --inject-fault 2:3 "
                                "--comm-timeout 2 --out " + out.string());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 5) << r.output;
  EXPECT_NE(r.output.find("all_reduce #"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 2 never arrived"), std::string::npos) << r.output;
  EXPECT_LT(took, 30.0);
  EXPECT_EQ(read_json(out / "summary.json")["exit_code"], 5);
  fs::remove_all(out);
}
