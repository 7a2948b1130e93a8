// `meshsim train --precision`: a bf16 ZeRO-2 run trains and its summary.json splits the model
// states as mixed precision does (bf16 parameters and gradients, fp32 master weights and Adam
// moments); fp16, which LibTorch 1.13 cannot compute on the CPU, and unknown precisions are
// one-line usage errors.
#include <gtest/gtest.h>

#include <cmath>

#include "cli_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kCnnParameters = 421642;

} // namespace

TEST(CliPrecision, Bf16ZeroTwoSplitsModelStatesByCategory) {
  const auto out = fresh_dir("bf16");
  const auto r =
      run_meshsim("train --precision bf16 --strategy ddp --zero 2 --gpus 4 --max-steps 20 "
                  "--data synthetic --synthetic-train 1024 --synthetic-test 128 "
                  "--batch-size 16 --out " +
                  out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(out / "config.json")["precision"], "bf16");
  const auto s = read_json(out / "summary.json");
  EXPECT_LT(s["final_loss"].get<double>(), std::log(10.0)); // below chance: it learned
  for (const auto& g : s["gpus"]) {
    const auto& peak = g["peak_by_category"];
    const int64_t params = peak["parameters"], grads = peak["gradients"], opt = peak["optimizer"];
    // Every unit is padded to a multiple of 4 (docs/zero.md): Ψ' = params / 2 elements, at
    // most 3 per unit more than Ψ; the CNN has 4 blocks, so at most 12.
    ASSERT_EQ(params % 2, 0);
    const int64_t padded = params / 2;
    EXPECT_GE(padded, kCnnParameters);
    EXPECT_LE(padded, kCnnParameters + 12);
    EXPECT_EQ(grads, 2 * padded / 4); // bf16 gradient shard
    EXPECT_EQ(opt, 12 * padded / 4);  // fp32 master + m + v of the shard
    EXPECT_EQ(g["model_state_bytes"], 2 * padded + 14 * padded / 4); // 2Ψ + 14Ψ/N
  }
}

TEST(CliPrecision, Fp16AndUnknownPrecisionsAreUsageErrors) {
  for (const auto& [flag, message] :
       {std::pair<std::string, std::string>{"fp16", "--precision fp16 cannot train on the CPU"},
        {"fp8", "--precision fp8 is for meshsim plan"},
        {"fp4", "unknown --precision 'fp4' (choose fp32, bf16, fp16, or fp8 in a plan)"}}) {
    const auto out = fresh_dir("precision");
    const auto r = run_meshsim("train --gpus 2 --data synthetic --precision " + flag + " --out " +
                               out.string());
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "one line: " << r.output;
    EXPECT_FALSE(fs::exists(out));
  }
}

// The fp32 master weights (and the moments) are part of the checkpoint: a bf16 run stopped at
// step 5 and resumed ends exactly where the uninterrupted run does, which rounding the bf16
// parameters back into fresh masters would not. Another precision cannot resume it.
TEST(CliPrecision, Bf16ResumeContinuesFromTheMasterWeights) {
  const std::string run = "train --precision bf16 --gpus 2 --data synthetic --synthetic-train 512 "
                          "--synthetic-test 64 --batch-size 16 ";
  const auto whole = fresh_dir("bf16-whole"), half = fresh_dir("bf16-half"),
             resumed = fresh_dir("bf16-resumed"), other = fresh_dir("bf16-fp32");
  ASSERT_EQ(run_meshsim(run + "--max-steps 10 --out " + whole.string()).code, 0);
  ASSERT_EQ(run_meshsim(run + "--max-steps 5 --out " + half.string()).code, 0);
  const auto r =
      run_meshsim(run + "--max-steps 10 --resume " + half.string() + " --out " + resumed.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(resumed / "summary.json")["final_loss"],
            read_json(whole / "summary.json")["final_loss"]);
  const auto fp32 = run_meshsim("train --gpus 2 --data synthetic --synthetic-train 512 "
                                "--synthetic-test 64 --batch-size 16 --max-steps 10 --resume " +
                                half.string() + " --out " + other.string());
  EXPECT_EQ(fp32.code, 2) << fp32.output;
  EXPECT_NE(
      fp32.output.find("it was trained with --precision bf16; this run uses --precision fp32"),
      std::string::npos)
      << fp32.output;
}
