// A resumed run ends with the same parameters (and optimizer state) as an uninterrupted one.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <random>

#include "../cli/cli_harness.h"
#include "train/checkpoint.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

// Every tensor of a run's latest checkpoint, keyed by name (per-rank parts: "rank-R/name").
std::vector<std::pair<std::string, torch::Tensor>> read_checkpoint(const fs::path& run) {
  const fs::path at = meshsim::resolve_checkpoint(run);
  std::vector<std::pair<std::string, fs::path>> files{{"", at / "model.pt"}};
  if (!fs::exists(at / "model.pt")) {
    files.clear();
    for (int r = 0; fs::exists(at / ("rank-" + std::to_string(r) + ".pt")); ++r)
      files.emplace_back("rank-" + std::to_string(r) + "/", at / ("rank-" + std::to_string(r) + ".pt"));
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [prefix, file] : files) {
    torch::serialize::InputArchive archive;
    archive.load_from(file.string());
    for (const auto& key : archive.keys()) {
      c10::IValue v;
      archive.read(key, v);
      if (v.isTensor()) out.emplace_back(prefix + key, v.toTensor());
    }
  }
  return out;
}

void expect_same_checkpoints(const fs::path& a_run, const fs::path& b_run) {
  auto a = read_checkpoint(a_run), b = read_checkpoint(b_run);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::allclose(a[i].second, b[i].second, 1e-6, 1e-7)) << a[i].first;
  }
}

const std::string kSmallGpt = "train --model gpt --data synthetic --synthetic-train 256 --synthetic-test 32 "
                              "--layers 2 --hidden 32 --heads 4 --seq-len 16 --vocab 64 --batch-size 8 "
                              "--epochs 3 ";

} // namespace

// Runs `common` for `total` steps without a break, and for `stop` steps with a checkpoint
// every `every` steps, then resumed to `total`: both must end with the same state and loss.
// `inspect` looks at the interrupted run's folder before the folders are removed.
void expect_resume_matches(const std::string& name, const std::string& common, int total,
                           int stop, int every,
                           const std::function<void(const fs::path& first)>& inspect) {
  const auto whole = fresh_dir(name + "-whole"), first = fresh_dir(name + "-first"),
             second = fresh_dir(name + "-second");
  const std::string steps = " --max-steps " + std::to_string(total);
  auto r = run_meshsim(common + steps + " --out " + whole.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_meshsim(common + " --max-steps " + std::to_string(stop) + " --checkpoint-every " +
                  std::to_string(every) + " --out " + first.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_meshsim(common + steps + " --resume " + first.string() + " --out " + second.string());
  ASSERT_EQ(r.code, 0) << r.output;

  EXPECT_EQ(read_json(whole / "summary.json")["final_loss"], read_json(second / "summary.json")["final_loss"]);
  expect_same_checkpoints(whole, second);
  inspect(first);
  for (const auto& d : {whole, first, second}) fs::remove_all(d);
}

void expect_resume(const std::string& model) {
  const std::string common = "train --data synthetic --synthetic-train 512 --synthetic-test 64 "
                             "--gpus 2 --batch-size 16 --epochs 2 --model " + model;
  // 512 samples / (2 x 16) = 16 steps per epoch; 24 steps cross the epoch boundary.
  expect_resume_matches(model, common, 24, 10, 5, [](const fs::path& first) {
    EXPECT_TRUE(fs::exists(first / "checkpoint" / "step-00000005" / "model.pt"));
    EXPECT_TRUE(fs::exists(first / "checkpoint" / "step-00000005" / "manifest.json"));
  });
}

TEST(TrainResume, ResumedRunEndsWhereTheUninterruptedOneDoes) {
  expect_resume("cnn");
  // LeNet has dropout: each rank's generator state travels in the checkpoint.
  expect_resume("lenet");
}

// Runs split across ranks write one part per rank; resuming them ends where the
// uninterrupted run does, for the 3-D mesh and for every ZeRO stage that shards state.
void expect_mesh_resume(const std::string& name, const std::string& layout, int ranks) {
  expect_resume_matches(name, kSmallGpt + layout, 10, 4, 2, [ranks](const fs::path& first) {
    // Complete folders only: one part per rank, no temporary folder left behind.
    for (const char* step : {"step-00000002", "step-00000004"})
      for (int rank = 0; rank < ranks; ++rank)
        EXPECT_TRUE(fs::exists(first / "checkpoint" / step / ("rank-" + std::to_string(rank) + ".pt")));
    for (const auto& entry : fs::directory_iterator(first / "checkpoint"))
      EXPECT_NE(entry.path().filename().string().front(), '.') << entry.path();
  });
}

TEST(TrainResume, MeshRunsResumeFromTheirPerRankParts) {
  // 256 samples / (dp 2 x 8) = 16 steps per epoch (dp 4: 8, so 10 steps cross an epoch).
  expect_mesh_resume("mesh", "--gpus 8 --tp 2 --pp 2 --zero 1 --schedule 1f1b --micro-batches 2", 8);
  expect_mesh_resume("zero2", "--gpus 4 --zero 2", 4);
  expect_mesh_resume("zero3", "--gpus 4 --zero 3 --optimizer adam", 4);
}

// Interleaved 1F1B: each rank's part is its two chunks (blocks r and r + 2 of 4), saved and
// resumed as any part; resuming it with another number of virtual stages is refused.
TEST(TrainResume, InterleavedPipelineResumesAndRefusesAnotherVirtualStageCount) {
  std::string gpt4 = kSmallGpt;
  gpt4.replace(gpt4.find("--layers 2"), 10, "--layers 4");
  const std::string layout = "--gpus 4 --pp 2 --virtual-stages 2 --micro-batches 2 ";
  expect_resume_matches("interleaved", gpt4 + layout, 10, 4, 2, [](const fs::path& first) {
    for (int rank = 0; rank < 4; ++rank)
      EXPECT_TRUE(fs::exists(first / "checkpoint" / "step-00000004" / ("rank-" + std::to_string(rank) + ".pt")));
  });

  const auto run = fresh_dir("interleaved-run"), out = fresh_dir("interleaved-out");
  ASSERT_EQ(run_meshsim(gpt4 + layout + "--max-steps 2 --out " + run.string()).code, 0);
  const auto r = run_meshsim(gpt4 + "--gpus 4 --pp 2 --micro-batches 2 --max-steps 4 --resume " +
                             run.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.output.find("it was written by 4 GPUs as dp=2 × tp=1 × pp=2 with 2 virtual stages, "
                    "zero 0, buckets of 25 MiB; this run is 4 GPUs as dp=2 × tp=1 × pp=2, zero 0"),
      std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& d : {run, out})
    fs::remove_all(d);
}

// A tied head across unequal stages: the last stage's copy of the embedding travels in its
// part, and the resumed run ends exactly where the uninterrupted one does; the stages' split
// is part of the layout, so another split is refused in one line.
TEST(TrainResume, TiedHeadOnUnequalStagesResumes) {
  std::string gpt3 = kSmallGpt;
  gpt3.replace(gpt3.find("--layers 2"), 10, "--layers 3");
  const std::string layout = "--gpus 2 --pp 2 --tie-head --micro-batches 2 ";
  expect_resume_matches("tied-unequal", gpt3 + layout + "--stage-layers 1,2 ", 10, 4, 2,
                        [](const fs::path&) {});
  const auto run = fresh_dir("tied-unequal-run"), out = fresh_dir("tied-unequal-out");
  ASSERT_EQ(run_meshsim(gpt3 + layout + "--stage-layers 1,2 --max-steps 2 --out " + run.string()).code, 0);
  const auto r = run_meshsim(gpt3 + layout + "--last-stage-layers 1 --max-steps 4 --resume " +
                             run.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("stages of 1,2 blocks; this run is 2 GPUs as dp=1 × tp=1 × pp=2, zero "
                          "0, buckets of 25 MiB, stages of 2,1 blocks"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& d : {run, out})
    fs::remove_all(d);
}

TEST(TrainResume, ACheckpointOfAnotherLayoutIsRefusedInOneLine) {
  const auto mesh = fresh_dir("layout-mesh"), plain = fresh_dir("layout-plain"), out = fresh_dir("layout-out");
  ASSERT_EQ(run_meshsim(kSmallGpt + "--gpus 4 --tp 2 --max-steps 2 --out " + mesh.string()).code, 0);
  ASSERT_EQ(run_meshsim(kSmallGpt + "--gpus 2 --max-steps 2 --out " + plain.string()).code, 0);

  // Refused before the run: exit 2, and no run folder is made.
  auto r = run_meshsim(kSmallGpt + "--gpus 4 --tp 4 --max-steps 4 --resume " + mesh.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("it was written by 4 GPUs as dp=2 × tp=2 × pp=1, zero 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this run is 4 GPUs as dp=1 × tp=4 × pp=1, zero 0"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));

  r = run_meshsim(kSmallGpt + "--gpus 4 --max-steps 4 --resume " + mesh.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("it holds one part per rank"), std::string::npos) << r.output;

  r = run_meshsim(kSmallGpt + "--gpus 2 --zero 1 --max-steps 4 --resume " + plain.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("it holds the whole model of a run without --tp/--pp/--zero"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& d : {mesh, plain, out}) fs::remove_all(d);
}

namespace {

// Starts meshsim with `args`, waits until its first checkpoint exists, lets it run on for
// `delay_ms`, and kills it with SIGKILL. Returns false if it ended on its own first.
bool kill_nine_while_checkpointing(const std::string& args, const fs::path& out, int delay_ms) {
  const std::string cmd = std::string(MESHSIM_BINARY) + " " + args + " --no-progress";
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  auto waited_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  };
  int status = 0;
  // Polling the child's folder: there is nothing to wait on across processes.
  while (!fs::exists(out / "checkpoint" / "latest") && waited_ms() < 60000) {
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    usleep(2000);
  }
  const auto until = waited_ms() + delay_ms;
  while (waited_ms() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    usleep(1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status);
}

// kill -9 at random moments of a run that checkpoints every step, then a resume into the
// same folder: it must find a sound `latest`, and end exactly where the uninterrupted run
// ends. Whole-model (CNN) and per-rank (ZeRO 1 GPT) checkpoints.
void expect_survives_kill_nine(const std::string& name, const std::string& common, int trials,
                               uint32_t seed) {
  const auto whole = fresh_dir(name + "-whole");
  ASSERT_EQ(run_meshsim(common + " --out " + whole.string()).code, 0);
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> delay_ms(0, 400);
  int killed = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const auto out = fresh_dir(name + "-killed");
    const int delay = delay_ms(random);
    if (!kill_nine_while_checkpointing(common + " --checkpoint-every 1 --out " + out.string(), out, delay)) {
      fs::remove_all(out);
      continue;  // it finished before the kill: nothing to resume
    }
    ++killed;
    const auto r = run_meshsim(common + " --resume " + out.string() + " --out " + out.string());
    ASSERT_EQ(r.code, 0) << "killed after " << delay << " ms: " << r.output;
    EXPECT_EQ(read_json(whole / "summary.json")["final_loss"], read_json(out / "summary.json")["final_loss"]);
    expect_same_checkpoints(whole, out);
    for (const auto& entry : fs::directory_iterator(out / "checkpoint"))
      EXPECT_NE(entry.path().filename().string().front(), '.') << entry.path();
    fs::remove_all(out);
  }
  std::cout << name << ": " << killed << " of " << trials << " runs killed mid-run and resumed\n";
  EXPECT_GE(killed, trials / 2) << "the runs ended before most kills; lengthen them";
  fs::remove_all(whole);
}

} // namespace

TEST(TrainResume, KillNineDuringCheckpointsThenResumeEndsWhereTheUninterruptedRunDoes) {
  expect_survives_kill_nine("kill-cnn",
                            "train --data synthetic --synthetic-train 512 --synthetic-test 64 "
                            "--gpus 2 --batch-size 16 --max-steps 40 --model cnn",
                            5, 11);
  expect_survives_kill_nine("kill-zero", kSmallGpt + "--gpus 4 --zero 1 --max-steps 40", 3, 12);
}
