// A resumed run ends with the same parameters (and optimizer state) as an uninterrupted one.
#include <gtest/gtest.h>

#include "../cli/cli_harness.h"
#include "train/checkpoint.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::pair<std::string, torch::Tensor>> read_checkpoint(const fs::path& run) {
  torch::serialize::InputArchive archive;
  archive.load_from(meshsim::resolve_checkpoint(run).string());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    archive.read(key, t);
    out.emplace_back(key, t);
  }
  return out;
}

} // namespace

TEST(TrainResume, ResumedRunEndsWhereTheUninterruptedOneDoes) {
  const std::string common = "train --data synthetic --synthetic-train 512 --synthetic-test 64 "
                             "--gpus 2 --batch-size 16 --epochs 2 ";
  const auto whole = fresh_dir("whole"), first = fresh_dir("first"), second = fresh_dir("second");
  // 512 samples / (2 x 16) = 16 steps per epoch; 24 steps cross the epoch boundary.
  ASSERT_EQ(run_meshsim(common + "--max-steps 24 --out " + whole.string()).code, 0);
  ASSERT_EQ(run_meshsim(common + "--max-steps 10 --checkpoint-every 5 --out " + first.string()).code, 0);
  auto r = run_meshsim(common + "--max-steps 24 --resume " + first.string() + " --out " + second.string());
  ASSERT_EQ(r.code, 0) << r.output;

  auto a = read_checkpoint(whole), b = read_checkpoint(second);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::allclose(a[i].second, b[i].second, 1e-6, 1e-7)) << a[i].first;
  }
  EXPECT_EQ(fs::exists(first / "checkpoint" / "step-00000005.pt"), true);
  for (const auto& d : {whole, first, second}) fs::remove_all(d);
}
