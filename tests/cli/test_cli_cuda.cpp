// `meshsim train --device cuda`: a one-line refusal where there is no card, and on a card a
// run folder like the CPU's, with the segments each virtual GPU took and out-of-memory exit 4.
#include <gtest/gtest.h>

#include <algorithm>

#include "../mesh/cuda_skip.h"
#include "cli_harness.h"

using namespace meshsim::testing;

namespace {
const std::string kRun = "train --data synthetic --model cnn --gpus 4 --batch-size 16 ";
}

TEST(CliCuda, RefusedInOneLineWithoutACard) {
  const meshsim::CudaStatus card = meshsim::cuda_status();
  if (card.usable)
    GTEST_SKIP() << "a card is present: " << card.name;
  const CliResult r = run_meshsim(kRun + "--max-steps 1 --device cuda");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("meshsim: --device cuda: " + card.reason), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(CliCuda, InfoSaysWhichPathIsBuilt) {
  const CliResult r = run_meshsim_exactly("info");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(meshsim::cuda_built() ? "CUDA path: built" : "CUDA path: compiled out"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("GPU: "), std::string::npos) << r.output;
}

TEST(CliCuda, TrainsOnTheCard) {
  MESHSIM_REQUIRE_CUDA();
  const auto dir = fresh_dir("cli_cuda_train");
  const CliResult r = run_meshsim(kRun + "--max-steps 20 --device cuda --out " + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto summary = read_json(dir / "summary.json");
  EXPECT_EQ(summary["device"], "cuda");
  for (const auto& g : summary["gpus"]) {
    EXPECT_GT(g["peak_by_category"]["parameters"].get<int64_t>(), 0);
    EXPECT_GE(g["peak_reserved_bytes"].get<int64_t>(), g["peak_bytes"].get<int64_t>());
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "memory.csv"));
}

TEST(CliCuda, TooSmallAGpuExits4) {
  MESHSIM_REQUIRE_CUDA();
  const CliResult r = run_meshsim(kRun + "--max-steps 2 --device cuda --gpu-mem 1MiB");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("out of memory on gpu"), std::string::npos) << r.output;
}
