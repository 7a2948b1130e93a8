// `meshsim plan` from the command line: the --json contract and --out folder, real-size
// presets planned in well under a second, and one line with exit 2 for each bad input.
#include <gtest/gtest.h>

#include "cli_harness.h"
#include "models/presets.h"

namespace meshsim {
namespace {

using testing::fresh_dir;
using testing::read_json;
using testing::run_meshsim;

TEST(CliPlan, JsonHasEveryFieldAndTheOutFolderHoldsPlanAndTrace) {
  const auto dir = fresh_dir("plan-json");
  const auto r = run_meshsim("plan --model gpt --cluster 4xa100-80 --pp 2 --micro-batches 4 "
                             "--batch-size 8 --json --out " + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json plan = read_json(dir / "plan.json");
  for (const char* key : {"step_seconds", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "fits",
                          "stages"})
    EXPECT_TRUE(plan.contains(key)) << key;
  ASSERT_EQ(plan["stages"].size(), 2u); // one entry per stage: its tp ranks are alike
  for (const auto& s : plan["stages"]) {
    int64_t sum = 0;
    for (const auto& [name, bytes] : s["peak_by_category"].items())
      sum += bytes.get<int64_t>();
    // A peak is at most the sum of the categories' own peaks, and at least the largest one.
    EXPECT_LE(s["peak_bytes"].get<int64_t>(), sum);
    EXPECT_GT(s["model_state_bytes"].get<int64_t>(), 0);
  }
  EXPECT_TRUE(plan["fits"].get<bool>());
  EXPECT_GT(plan["step_seconds"].get<double>(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir / "trace.json"));
  if (meshsim::testing::picture_expected()) {
    EXPECT_TRUE(std::filesystem::exists(dir / "memory.png")) << r.output;
  }
}

// `meshsim plan --json` of Llama 3 8B with ZeRO 3 on 8 H100s at `precision`, parsed.
nlohmann::json plan_llama3_8b_zero3(const std::string& precision) {
  const auto r = run_meshsim("plan --preset llama3-8b --cluster 8xh100 --zero 3 --precision " +
                             precision + " --batch-size 1 --seq-len 2048 --json");
  EXPECT_EQ(r.code, 0) << r.output;
  const size_t open = r.output.find('{');
  return open == std::string::npos ? nlohmann::json::object()
                                   : nlohmann::json::parse(r.output.substr(open));
}

int64_t llama3_8b_parameters() {
  return preset_parameter_count("llama", find_preset("llama3-8b")->shape);
}

TEST(CliPlan, ARealSizePresetIsPlannedOnTheMetaDevice) {
  // Llama 3 8B with ZeRO 3 over 8 GPUs: the model state per GPU between steps is the ZeRO
  // paper's 16Ψ/N in bf16 (Ψ divides by 8, so no padding), a number no CPU could hold.
  const nlohmann::json json = plan_llama3_8b_zero3("bf16");
  ASSERT_TRUE(json.contains("stages"));
  const int64_t psi = llama3_8b_parameters();
  ASSERT_EQ(psi % 8, 0);
  EXPECT_EQ(json["stages"][0]["model_state_bytes"].get<int64_t>(), 16 * psi / 8);
}

// fp16 (the ZeRO paper's mixed precision) is planned although no CPU can train it: the same
// 2 + 2 + 12 bytes per parameter as bf16, sharded 8 ways by stage 3.
TEST(CliPlan, Fp16IsPlannedWithTheZeroPapersBytes) {
  const nlohmann::json json = plan_llama3_8b_zero3("fp16");
  ASSERT_TRUE(json.contains("stages"));
  EXPECT_EQ(json["precision"].get<std::string>(), "fp16");
  EXPECT_EQ(json["stages"][0]["model_state_bytes"].get<int64_t>(), 16 * llama3_8b_parameters() / 8);
}

// The same layout with and without sequence parallelism: the model state is the same, the
// activations of the blocks outside attention and the MLP are split 8 ways.
TEST(CliPlan, SequenceParallelSplitsTheActivations) {
  int64_t activations[2] = {0, 0};
  for (bool sequence_parallel : {false, true}) {
    const auto r = run_meshsim(std::string("plan --model gpt --cluster 8xh100 --tp 8 --heads 8 "
                                           "--hidden 512 --layers 4 --seq-len 1024 --precision "
                                           "bf16 --batch-size 1 --json") +
                               (sequence_parallel ? " --sequence-parallel" : ""));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto json = nlohmann::json::parse(r.output.substr(r.output.find('{')));
    EXPECT_EQ(json["layout"]["sequence_parallel"], sequence_parallel);
    activations[sequence_parallel] =
        json["stages"][0]["peak_by_category"]["activations"].get<int64_t>();
    EXPECT_GT(json["step_seconds"].get<double>(), 0);
  }
  EXPECT_LT(activations[1], activations[0]);
}

TEST(CliPlan, MicroBatchSizeAndSelectiveRecomputeAreTheLayout) {
  // 4 GPUs as dp 2 × pp 2: a global batch of 16 in micro-batches of 2 is 4 per replica.
  const auto r = run_meshsim("plan --model gpt --cluster 4xa100-80 --pp 2 --global-batch-size 16 "
                             "--micro-batch-size 2 --recompute selective --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(json["global_batch_size"], 16);
  EXPECT_EQ(json["layout"]["micro_batches"], 4);
  EXPECT_EQ(json["layout"]["micro_batch_size"], 2);
  EXPECT_EQ(json["layout"]["recompute"], "selective");
  EXPECT_EQ(json["layout"]["attention"], "fused"); // the default
}

// --elementwise eager counts RMSNorm and the rotation op by op: the same memory, a longer step
// (more kernels, more bytes), and the plan says which it counted.
TEST(CliPlan, EagerElementwiseLengthensTheStepNotTheMemory) {
  nlohmann::json plans[2];
  for (const bool eager : {false, true}) {
    const auto r = run_meshsim("plan --model llama --cluster 8xh100 --hidden 512 --heads 8 "
                               "--kv-heads 2 --layers 4 --seq-len 1024 --precision bf16 "
                               "--batch-size 1 --json" +
                               std::string(eager ? " --elementwise eager" : ""));
    ASSERT_EQ(r.code, 0) << r.output;
    plans[eager] = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  }
  EXPECT_EQ(plans[0]["assumptions"]["elementwise"], "fused (one kernel a step)");
  EXPECT_EQ(plans[1]["assumptions"]["elementwise"], "eager (RMSNorm and the rotation op by op)");
  EXPECT_GT(plans[1]["step_seconds"].get<double>(), plans[0]["step_seconds"].get<double>());
  EXPECT_EQ(plans[1]["stages"], plans[0]["stages"]);
}

// Llama 3 8B on one node of 8 H100s: every layout is tried, the fitting ones come fastest
// first, the best is planned in full, and no layout puts tp across nodes.
TEST(CliPlan, SearchRanksTheLayoutsThatFit) {
  const auto r = run_meshsim("plan --search --preset llama3-8b --cluster 8xh100 --precision bf16 "
                             "--global-batch-size 32 --seq-len 4096 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output.substr(r.output.find("{\n")));
  const auto& layouts = json["layouts"];
  ASSERT_FALSE(layouts.empty()) << r.output;
  EXPECT_LE(layouts.size(), 10u);
  EXPECT_TRUE(layouts[0]["planned_in_full"].get<bool>());
  const int64_t memory = json["gpu_memory_bytes"].get<int64_t>();
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto& l = layouts[i];
    EXPECT_TRUE(l["fits"].get<bool>());
    EXPECT_LE(l["peak_bytes"].get<int64_t>(), memory);
    const auto& y = l["layout"];
    EXPECT_EQ(y["dp"].get<int>() * y["cp"].get<int>() * y["tp"].get<int>() * y["pp"].get<int>(),
              8);
    EXPECT_EQ(y["micro_batch_size"].get<int64_t>() * y["micro_batches"].get<int>() *
                  y["dp"].get<int>(),
              32);
    if (i > 0) {
      EXPECT_GE(layouts[i - 1]["tokens_per_s_per_gpu"].get<double>(),
                l["tokens_per_s_per_gpu"].get<double>());
    }
  }
  EXPECT_GT(json["invalid"].get<int>(), 0); // micro-batch sizes the batch does not divide into
  EXPECT_EQ(json["planned"].get<int>() + json["invalid"].get<int>() <= json["candidates"].get<int>(),
            true);
  for (const auto& f : json["rejected"])
    EXPECT_EQ(f["reason"].get<std::string>().rfind("does not ", 0), 0u) << f.dump();
}

// An image model's plan: the batch is images, and the rates say so.
TEST(CliPlan, ResNet50PlansInImagesPerSecond) {
  const auto r = run_meshsim("plan --model resnet50 --cluster 8xv100-32 --batch-size 32 "
                             "--optimizer sgd");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* text : {"resnet50 (25.6M parameters)", "global batch 256", "images/s per GPU",
                           "fits: yes"})
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
}

TEST(CliPlan, BadInputIsOneLineAndExit2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --model gpt --cluster 8xh100 --tp 3", "not divisible"},
      {"plan --preset gpt-9b --cluster 8xh100", "unknown preset"},
      {"plan --model cnn --cluster 8xh100", "cnn is built on the host"},
      {"plan --model resnet50 --cluster 8xv100-32 --search", "plan --search lays out transformers"},
      {"plan --model gpt", "needs --cluster"},
      {"plan --model gpt --cluster 8xh100 --gpus 4", "differs from --cluster"},
      {"plan --model gpt --cluster 8xh100 --sequence-parallel", "--sequence-parallel needs --tp"},
      {"plan --model llama --cluster 8xh100 --tp 8 --heads 8 --kv-heads 8 --seq-len 60 "
       "--sequence-parallel",
       "--seq-len 60 is not divisible by --tp 8"},
      {"plan --model gpt --cluster 8xh100 --global-batch-size 12 --micro-batch-size 4",
       "global batch 12 is not divisible by --micro-batch-size 4 × dp 8 = 32"},
      {"plan --model gpt --cluster 8xh100 --global-batch-size 32 --micro-batch-size 2 "
       "--micro-batches 4",
       "--micro-batches 4 conflicts with --micro-batch-size 2"},
      {"plan --model gpt --cluster 8xh100 --recompute partial", "unknown --recompute 'partial'"},
      {"plan --model gpt --cluster 8xh100 --attention flash",
       "unknown --attention 'flash' (choose fused or eager)"},
      {"plan --model resnet50 --cluster 8xv100-32 --attention eager",
       "--attention applies to the attention of --model gpt and llama, not resnet50"},
      {"plan --model gpt --cluster 8xh100 --search", "--search needs --global-batch-size"},
      {"plan --model llama --cluster 8xh100 --elementwise compiled",
       "unknown --elementwise 'compiled' (choose fused or eager)"},
      {"train --model gpt --device meta", "meta is the device meshsim plan runs on"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = run_meshsim_in_process(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << args << "\n" << r.output;
    EXPECT_LE(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
  }
}

} // namespace
} // namespace meshsim
