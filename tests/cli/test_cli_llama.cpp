// `meshsim train --model llama`: it reads byte-level text by default like the GPT, trains
// with tensor and pipeline parallelism, and a layout its heads cannot split is a one-line
// usage error (exit 2) before anything runs.
#include <gtest/gtest.h>

#include "cli_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

const std::string kLlama = "train --model llama --hidden 32 --heads 4 --seq-len 16 ";

} // namespace

TEST(CliLlama, TrainsOnTextWithTensorAndPipelineParallel) {
  const auto out = fresh_dir("llama");
  const auto r = run_meshsim(kLlama +
                             "--gpus 4 --tp 2 --pp 2 --schedule 1f1b --micro-batches 2 "
                             "--batch-size 8 --max-steps 12 --log-every 1 --eval-limit 16 --out " +
                             out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto config = read_json(out / "config.json");
  EXPECT_EQ(config["model"], "llama");
  EXPECT_EQ(config["data"], "/usr/share/common-licenses/GPL-3") << "the GPT's text by default";
  const auto s = read_json(out / "summary.json");
  EXPECT_EQ(s["layout"]["tp"], 2);
  EXPECT_EQ(s["layout"]["pp"], 2);
  const auto l = run_losses(out);
  ASSERT_EQ(l.size(), 12u);
  EXPECT_LT(l.back(), l.front()) << r.output;
  fs::remove_all(out);
}

TEST(CliLlama, HeadsThatDoNotSplitAreAUsageError) {
  const auto out = fresh_dir("llama-bad");
  const auto r = run_meshsim(kLlama + "--gpus 3 --tp 3 --out " + out.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--heads 4 is not divisible by --tp 3"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
}
