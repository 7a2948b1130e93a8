// Tests for memory.png's picture (report/memory_picture.h): which step it shows, how GPUs are
// grouped, and what the script draws.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "report/memory_picture.h"

namespace meshsim {
namespace {

CategoryBytes picture_bytes(int64_t parameters, int64_t activations) {
  CategoryBytes b{};
  b[0] = parameters;
  b[3] = activations;
  return b;
}

// A step of `gpus` GPUs, each rank sampling its own forward and backward with `act(g)` bytes
// of activations after forward.
std::vector<MemorySample> steps(int gpus, int64_t last_step, int64_t (*act)(int), int rank_of = 1) {
  std::vector<MemorySample> out;
  double t = 0;
  for (int64_t step = 1; step <= last_step; ++step)
    for (const char* phase : {"forward", "backward"})
      for (int r = 0; r < gpus; ++r) {
        MemorySample s;
        s.time_s = t += 0.01;
        s.step = step;
        s.phase = phase;
        s.rank = rank_of ? r : -1;
        for (int g = 0; g < gpus; ++g) {
          const int64_t a = std::string(phase) == "forward" ? act(g) : 0;
          s.by_category.push_back(picture_bytes(1 << 20, a));
          s.bytes.push_back((1 << 20) + a);
        }
        out.push_back(s);
      }
  return out;
}

TEST(MemoryPicture, ShowsTheSecondToLastTrainingStep) {
  auto same = [](int) -> int64_t { return 4 << 20; };
  EXPECT_EQ(picture_step(steps(2, 5, same)), 4);
  EXPECT_EQ(picture_step(steps(2, 1, same)), 1);
  EXPECT_EQ(picture_step({}), -1);
}

TEST(MemoryPicture, IdenticalGpusShareAPanel) {
  // Data parallel: every rank the same.
  auto same = [](int) -> int64_t { return 4 << 20; };
  auto ddp = step_classes(steps(4, 3, same), 2);
  ASSERT_EQ(ddp.size(), 1u);
  EXPECT_EQ(ddp[0].gpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ddp[0].phases, (std::vector<std::string>{"forward", "backward"}));
  EXPECT_EQ(ddp[0].bytes[0][3], 4 << 20);
  // A pipeline of two stages: stage 0 (gpus 0, 1) holds more activations than stage 1.
  auto stages = [](int g) -> int64_t { return g < 2 ? 8 << 20 : 2 << 20; };
  auto pp = step_classes(steps(4, 3, stages), 2);
  ASSERT_EQ(pp.size(), 2u);
  EXPECT_EQ(pp[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(pp[1].gpus, (std::vector<int>{2, 3}));
  // DataParallel's one thread samples for every GPU: each GPU's course is every sample.
  auto gpu0 = [](int g) -> int64_t { return g == 0 ? 8 << 20 : 1 << 20; };
  auto dp = step_classes(steps(3, 2, gpu0, /*rank_of=*/0), 2);
  ASSERT_EQ(dp.size(), 2u);
  EXPECT_EQ(dp[0].gpus, (std::vector<int>{0}));
  EXPECT_EQ(dp[1].gpus, (std::vector<int>{1, 2}));
  EXPECT_EQ(dp[1].phases.size(), 6u);  // 3 ranks' forward and backward samples
}

TEST(MemoryPicture, GpuRangesJoinRuns) {
  EXPECT_EQ(gpu_ranges({0}), "gpu0");
  EXPECT_EQ(gpu_ranges({1, 2, 3}), "gpu1-gpu3");
  EXPECT_EQ(gpu_ranges({0, 4, 5, 6, 7}), "gpu0, gpu4-gpu7");
}

TEST(MemoryPicture, ScriptHasAPanelPerKindOfGpuEveryPeakAndTheRun) {
  auto stages = [](int g) -> int64_t { return (g + 1) << 20; };
  MemoryPictureInput in;
  in.samples = steps(12, 4, stages);
  in.capacities.assign(12, 16 << 20);  // in range: drawn
  for (int g = 0; g < 12; ++g) in.peaks.push_back(picture_bytes(1 << 20, (g + 1) << 20));
  in.title = "a title";
  const std::string s = memory_picture_script(in, "/tmp/out.png");
  EXPECT_NE(s.find("gpu0: step 3"), std::string::npos);
  EXPECT_NE(s.find("gpu7: step 3 (4 more kinds of GPU not drawn)"), std::string::npos);
  EXPECT_EQ(s.find("gpu8: step 3"), std::string::npos);  // at most kMaxStepPanels
  EXPECT_NE(s.find("$peaks << EOD\n\"gpu0\""), std::string::npos);
  EXPECT_NE(s.find("\"gpu11\""), std::string::npos);
  EXPECT_NE(s.find("16 with lines dt 2"), std::string::npos);  // the capacity, in MiB
  EXPECT_NE(s.find("title 'activations'"), std::string::npos);
  EXPECT_NE(s.find("$strip << EOD\n1 "), std::string::npos);
  // A capacity far above the bars is written in the title instead.
  in.capacities.assign(12, int64_t{80} << 30);
  const std::string far = memory_picture_script(in, "/tmp/out.png");
  EXPECT_NE(far.find("(capacity 80.0 GiB, off scale)"), std::string::npos);
  EXPECT_EQ(far.find("with lines dt 2 lw 2 lc rgb 'black' notitle"), std::string::npos);
}

TEST(MemoryPicture, NoTrainingStepIsAnError) {
  MemoryPictureInput in;
  EXPECT_THROW(memory_picture_script(in, "/tmp/x.png"), std::invalid_argument);
}

TEST(MemoryPicture, GnuplotDrawsIt) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  auto stages = [](int g) -> int64_t { return (g + 1) << 20; };
  MemoryPictureInput in;
  in.samples = steps(4, 3, stages);
  in.capacities.assign(4, 16 << 20);
  for (int g = 0; g < 4; ++g) in.peaks.push_back(picture_bytes(1 << 20, (g + 1) << 20));
  in.title = "test";
  const auto png = std::filesystem::temp_directory_path() /
                   ("meshsim-picture-" + std::to_string(::getpid()) + ".png");
  std::string error;
  ASSERT_TRUE(plot_memory_picture(png, in, &error)) << error;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
  std::filesystem::remove(png);
}

} // namespace
} // namespace meshsim
