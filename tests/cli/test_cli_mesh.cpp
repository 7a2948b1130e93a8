// `meshsim train` with a dp × tp × pp layout on the GPT: a bad layout is a one-line error with
// exit code 2 before anything runs, and a small 8-GPU run trains and writes its run folder.
#include <gtest/gtest.h>

#include <algorithm>

#include "cli_harness.h"
#include "config/validation_steps.h"
#include "models/models.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

const std::string kMeshGpt =
    "train --model gpt --data synthetic --synthetic-train 256 --synthetic-test 32 --vocab 64 "
    "--hidden 32 --heads 4 --seq-len 16 ";

void expect_usage_error(const std::string& args, const std::string& message) {
  const auto out = fresh_dir("layout");
  const auto r = run_meshsim_in_process(kMeshGpt + args + " --out " + out.string());
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  EXPECT_FALSE(fs::exists(out)) << "nothing may run before the layout is checked";
}

} // namespace

TEST(CliMesh, BadLayoutsAreUsageErrors) {
  expect_usage_error("--gpus 6 --tp 2 --pp 2", "--gpus 6 is not divisible by --tp 2 × --pp 2 = 4");
  expect_usage_error("--gpus 3 --tp 3", "--heads 4 is not divisible by --tp 3");
  expect_usage_error("--gpus 4 --pp 4 --layers 2", "--layers 2 is fewer than --pp 4");
  expect_usage_error("--gpus 4 --pp 2 --batch-size 6 --micro-batches 4",
                     "global batch 12 (--batch-size 6 × dp 2) is not divisible by dp 2 × "
                     "micro-batches 4 = 8");
  expect_usage_error("--gpus 4 --pp 2 --global-batch-size 30 --micro-batches 4",
                     "global batch 30 is not divisible by dp 2 × micro-batches 4 = 8");
  expect_usage_error("--gpus 4 --pp 2 --global-batch-size 30 --micro-batch-size 4",
                     "global batch 30 is not divisible by --micro-batch-size 4 × dp 2 = 8");
  expect_usage_error(
      "--gpus 4 --pp 2 --global-batch-size 16 --micro-batch-size 2 --micro-batches 2",
      "--micro-batches 2 conflicts with --micro-batch-size 2: global batch 16 ÷ "
      "(2 × dp 2) = 4 micro-batches");
  expect_usage_error(
      "--gpus 4 --pp 2 --global-batch-size 16 --micro-batch-size 2 --micro-batches 1",
      "--micro-batches 1 conflicts with --micro-batch-size 2");
  expect_usage_error("--gpus 2 --micro-batch-size 0",
                     "--micro-batch-size: must be at least 1, got 0");
  expect_usage_error("--gpus 2 --micro-batches 0", "--micro-batches: must be at least 1, got 0");
  expect_usage_error("--gpus 2 --recompute some",
                     "unknown --recompute 'some' (choose none, selective, op or full)");
  expect_usage_error("--gpus 2 --tp 2 --recompute op", meshsim::kRecomputeOpNeedsTp1);
  expect_usage_error("--gpus 4 --zero 4", "--zero must be 0, 1, 2 or 3");
  expect_usage_error("--gpus 2 --pp 2 --schedule zigzag", "unknown schedule 'zigzag'");
  expect_usage_error("--gpus 2 --tp 2 --no-loss-upcast",
                     "--no-loss-upcast runs with --tp 1 (got --tp 2): under tensor parallelism "
                     "the loss is Megatron's vocab-parallel cross-entropy, in fp32");
}

// HSDP's shard groups divide dp and shard ZeRO's state; keeping ZeRO-3's gathered parameters
// needs ZeRO 3 (docs/zero.md).
TEST(CliMesh, DpShardAndReshardAfterForwardRules) {
  expect_usage_error("--gpus 4 --zero 3 --dp-shard 3",
                     "--dp-shard 3 does not divide the 4 data-parallel ranks");
  expect_usage_error("--gpus 4 --dp-shard 2",
                     "--dp-shard 2 shards ZeRO's state: it needs --zero 1, 2 or 3");
  expect_usage_error("--gpus 4 --zero 3 --dp-shard 0", "--dp-shard: must be at least 1, got 0");
  expect_usage_error("--gpus 4 --precision bf16 --reduce-fp32",
                     "--reduce-fp32 is ZeRO's reduction of the gradients in fp32 (FSDP2's "
                     "reduce_dtype, Megatron's main_grad): it needs --zero 1, 2 or 3 (got "
                     "--zero 0)");
  expect_usage_error("--gpus 4 --zero 3 --reduce-fp32",
                     "--reduce-fp32 widens 16-bit gradients: it needs --precision bf16, fp16 or fp8");
  expect_usage_error("--gpus 4 --zero 2 --no-reshard-after-forward",
                     "--no-reshard-after-forward keeps ZeRO-3's gathered parameters: it needs "
                     "--zero 3");
}

TEST(CliMesh, DistributedOptimizerRules) {
  expect_usage_error("--gpus 4 --zero 2 --distributed-optimizer",
                     "--distributed-optimizer is ZeRO 1 as Megatron-LM runs it: it needs --zero 1 "
                     "(got --zero 2)");
  expect_usage_error("--gpus 4 --pp 2 --zero 1 --distributed-optimizer --tie-head",
                     "--distributed-optimizer with --pp needs an untied head (--no-tie-head): the "
                     "tied embedding's two copies sum whole gradients, which it reduces shard by "
                     "shard");
}

TEST(CliMesh, SequenceParallelNeedsTensorParallelAndASequenceThatSplits) {
  expect_usage_error("--gpus 2 --sequence-parallel",
                     "--sequence-parallel needs --tp 2 or more: it splits the sequence over the "
                     "tp group");
  for (const char* model : {"gpt", "llama"}) {
    const auto out = fresh_dir("sequence-parallel-bad");
    const auto r = run_meshsim(std::string("train --model ") + model +
                               " --data synthetic --vocab 64 --hidden 32 --heads 4 --seq-len 17 "
                               "--gpus 2 --tp 2 --sequence-parallel --out " +
                               out.string());
    EXPECT_EQ(r.code, 2) << model << "\n" << r.output;
    EXPECT_NE(r.output.find("--seq-len 17 is not divisible by --tp 2 (--sequence-parallel splits "
                            "the sequence over the tp group)"),
              std::string::npos)
        << model << "\n"
        << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << model << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << model;
  }
}

TEST(CliMesh, SequenceParallelTrainsAndIsSavedInTheRunFolder) {
  const auto out = fresh_dir("sequence-parallel");
  const auto r = run_meshsim(kMeshGpt +
                             "--layers 2 --gpus 4 --tp 2 --pp 2 --sequence-parallel "
                             "--micro-batches 2 --batch-size 8 --max-steps 10 --log-every 1 "
                             "--eval-limit 16 --out " +
                             out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dp=1 × tp=2 × pp=2 with sequence parallel"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_json(out / "config.json")["sequence_parallel"], true);
  const auto s = read_json(out / "summary.json");
  EXPECT_EQ(s["layout"]["sequence_parallel"], true);
  const std::vector<double> losses = run_losses(out);
  ASSERT_EQ(losses.size(), 10u);
  EXPECT_LT(losses.back(), losses.front()) << r.output;
  fs::remove_all(out);
}

TEST(CliMesh, EightGpusTwoByTwoByTwoTrains) {
  const auto out = fresh_dir("mesh");
  const auto r = run_meshsim(kMeshGpt +
                             "--layers 2 --gpus 8 --tp 2 --pp 2 --zero 1 --schedule 1f1b "
                             "--micro-batches 4 --batch-size 8 --max-steps 12 --log-every 1 "
                             "--eval-limit 16 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto s = read_json(out / "summary.json");
  EXPECT_EQ(s["layout"]["dp"], 2);
  EXPECT_EQ(s["layout"]["tp"], 2);
  EXPECT_EQ(s["layout"]["pp"], 2);
  std::istringstream metrics(read_text(out / "metrics.jsonl"));
  std::string line;
  std::vector<double> losses;
  while (std::getline(metrics, line)) losses.push_back(nlohmann::json::parse(line)["loss"]);
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front()) << r.output;
  // Stage 0 holds the embedding, stage 1 the final norm and head: their parameters differ.
  const auto& g = s["gpus"];
  EXPECT_NE(g[0]["peak_by_category"]["parameters"], g[4]["peak_by_category"]["parameters"]);
  EXPECT_EQ(g[0]["peak_by_category"]["parameters"], g[3]["peak_by_category"]["parameters"]);
  fs::remove_all(out);
}

// --virtual-stages: each bad value is one line and exit 2, before anything runs.
TEST(CliMesh, VirtualStagesBadValuesAreOneLineUsageErrors) {
  const std::pair<std::string, std::string> cases[] = {
      {"--gpus 2 --pp 2 --virtual-stages 0", "--virtual-stages: must be at least 1, got 0"},
      {"--gpus 2 --layers 4 --virtual-stages 2",
       "--virtual-stages 2 needs --pp 2 or more: it interleaves the chunks of several pipeline "
       "stages"},
      {"--gpus 2 --pp 2 --layers 4 --schedule gpipe --micro-batches 2 --virtual-stages 2",
       "--virtual-stages 2 runs with --schedule 1f1b (interleaved), not gpipe"},
      {"--gpus 2 --pp 2 --layers 4 --batch-size 6 --micro-batches 3 --virtual-stages 2",
       "--micro-batches 3 is not a multiple of --pp 2: the interleaved schedule runs "
       "micro-batches in groups of pp"},
      {"--gpus 2 --pp 2 --layers 3 --micro-batches 2 --virtual-stages 2",
       "--layers 3 is fewer than --pp 2 × --virtual-stages 2 = 4: every model chunk needs a "
       "layer"},
  };
  for (const auto& [args, message] : cases) {
    const auto out = fresh_dir("virtual-stages-bad");
    const auto r = run_meshsim_in_process(kMeshGpt + args + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
  const auto r = run_meshsim_in_process("train --model cnn --data synthetic --gpus 2 --pp 2 "
                                        "--micro-batches 2 --virtual-stages 4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--pp 2 × --virtual-stages 4 = 8 is more than cnn's 4 layers with "
                          "parameters: every model chunk needs one"),
            std::string::npos)
      << r.output;
}

// Interleaved 1F1B from the command line: 4 blocks as 4 chunks on 2 stages, beside dp 2. It
// learns, and the run folder says how it was laid out.
TEST(CliMesh, InterleavedPipelineTrainsAndIsSavedInTheRunFolder) {
  const auto out = fresh_dir("interleaved");
  const auto r = run_meshsim(kMeshGpt +
                             "--layers 4 --gpus 4 --pp 2 --virtual-stages 2 --micro-batches 4 "
                             "--batch-size 8 --max-steps 10 --log-every 1 --eval-limit 16 --out " +
                             out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dp=2 × tp=1 × pp=2, zero 0, 1f1b schedule (2 virtual stages), 4 "
                          "micro-batches"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_json(out / "config.json")["virtual_stages"], 2);
  const auto s = read_json(out / "summary.json");
  EXPECT_EQ(s["layout"]["virtual_stages"], 2);
  EXPECT_GT(s["test_samples"].get<int64_t>(), 0); // evaluation went through the chunks too
  const std::vector<double> losses = run_losses(out);
  ASSERT_EQ(losses.size(), 10u);
  EXPECT_LT(losses.back(), losses.front()) << r.output;
  // Each stage holds two blocks; stage 0 the embedding too, stage 1 the final norm and head.
  const auto& g = s["gpus"];
  EXPECT_NE(g[0]["peak_by_category"]["parameters"], g[2]["peak_by_category"]["parameters"]);
  EXPECT_EQ(g[0]["peak_by_category"]["parameters"], g[1]["peak_by_category"]["parameters"]);

  // A rerun from config.json keeps the layout.
  const auto again = fresh_dir("interleaved-again");
  const auto rerun = run_meshsim("train --config " + (out / "config.json").string() +
                                 " --max-steps 2 --out " + again.string());
  ASSERT_EQ(rerun.code, 0) << rerun.output;
  EXPECT_EQ(read_json(again / "config.json")["virtual_stages"], 2);
  fs::remove_all(out);
  fs::remove_all(again);
}

// --micro-batch-size makes the micro-batches from the global batch; config.json keeps the
// size, and a rerun from it that names --micro-batches instead takes that count.
TEST(CliMesh, MicroBatchSizeSetsTheMicroBatchesAndSurvivesConfigJson) {
  const auto out = fresh_dir("mbs");
  const auto r =
      run_meshsim(kMeshGpt +
                  "--layers 2 --gpus 4 --pp 2 --global-batch-size 8 --micro-batch-size 2 "
                  "--recompute selective --max-steps 2 --eval-limit 16 --out " +
                  out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(out / "summary.json")["layout"]["micro_batches"], 2); // 8 ÷ (2 × dp 2)
  const auto config = read_json(out / "config.json");
  EXPECT_EQ(config["micro_batch_size"], 2);
  EXPECT_EQ(config["micro_batches"], 2);
  EXPECT_EQ(config["recompute"], "selective");

  const auto again = fresh_dir("mbs-again");
  const auto rerun = run_meshsim("train --config " + (out / "config.json").string() +
                                 " --micro-batches 4 --out " + again.string());
  ASSERT_EQ(rerun.code, 0) << rerun.output;
  const auto second = read_json(again / "config.json");
  EXPECT_EQ(second["micro_batches"], 4);
  EXPECT_EQ(second["micro_batch_size"], 0);
  fs::remove_all(out);
  fs::remove_all(again);
}

// --stage-layers, --first-stage-layers, --last-stage-layers: each bad value is one line and
// exit 2, before anything runs.
TEST(CliMesh, UnequalStagesBadValuesAreOneLineUsageErrors) {
  const std::pair<std::string, std::string> cases[] = {
      {"--gpus 2 --pp 2 --layers 4 --stage-layers 1,2",
       "--stage-layers '1,2' sums to 3 blocks, --layers is 4"},
      {"--gpus 2 --pp 2 --layers 4 --stage-layers 1,2,1", "--stage-layers lists 3 stages, --pp has 2"},
      {"--gpus 2 --pp 2 --layers 4 --stage-layers 4,0",
       "--stage-layers '4,0': stage 1 has no block: every stage needs one"},
      {"--gpus 2 --pp 2 --layers 4 --stage-layers 2,x",
       "--stage-layers '2,x': 'x' is not a whole number of blocks (give e.g. 3,4,4,3)"},
      {"--gpus 2 --pp 2 --layers 4 --stage-layers 2,-2",
       "--stage-layers '2,-2': '-2' is not a whole number of blocks"},
      {"--gpus 2 --layers 4 --stage-layers 4",
       "--stage-layers and --first/--last-stage-layers need --pp 2 or more, got --pp 1"},
      {"--gpus 2 --pp 2 --layers 4 --first-stage-layers 1 --last-stage-layers 2",
       "--first-stage-layers 1 + --last-stage-layers 2 = 3 is not --layers 4 (--pp 2 has no "
       "other stage)"},
      {"--gpus 4 --pp 4 --layers 6 --first-stage-layers 3 --last-stage-layers 2",
       "--first-stage-layers 3 and --last-stage-layers 2 leave 1 of --layers 6 for the other 2 "
       "stages: every stage needs a block"},
      {"--gpus 2 --pp 2 --layers 4 --stage-layers 2,2 --first-stage-layers 2",
       "--stage-layers lists every stage: give it or --first-stage-layers / --last-stage-layers, "
       "not both"},
      {"--gpus 2 --pp 2 --layers 4 --micro-batches 2 --virtual-stages 2 --first-stage-layers 1",
       "--first/--last-stage-layers run without --virtual-stages (got 2); give --stage-layers "
       "with --pp × --virtual-stages counts instead"},
      {"--gpus 2 --pp 2 --layers 4 --micro-batches 2 --virtual-stages 2 --stage-layers 2,2",
       "--stage-layers lists 2 counts, --pp 2 × --virtual-stages 2 has 4 model chunks"},
      {"--gpus 2 --pp 2 --first-stage-layers 0", "--first-stage-layers: must be at least 1, got 0"},
  };
  for (const auto& [args, message] : cases) {
    const auto out = fresh_dir("stage-layers-bad");
    const auto r = run_meshsim_in_process(kMeshGpt + args + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
  const auto r = run_meshsim_in_process(
      "train --model cnn --data synthetic --gpus 2 --pp 2 --stage-layers 1,3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("count transformer blocks (gpt, llama); cnn is cut at its layers with "
                          "parameters"),
            std::string::npos)
      << r.output;
}

// A tied head with a pipeline trains (exit 0), and with ZeRO 2 or 3, which shard the
// gradients the embedding group sums whole, it is one line (the rule is the model's: reached
// once --zero 2 runs with --pp).
TEST(CliMesh, TiedHeadWithAPipeline) {
  const auto out = fresh_dir("tied-pp");
  const auto r = run_meshsim(kMeshGpt +
                             "--gpus 2 --pp 2 --layers 3 --tie-head --micro-batches 2 "
                             "--batch-size 8 --max-steps 3 --first-stage-layers 1 --out " +
                             out.string());
  EXPECT_EQ(r.code, 0) << r.output;
  fs::remove_all(out);
  meshsim::TrainConfig c;
  c.model = "gpt";
  c.gpus = 4;
  c.pp = 2;
  c.zero = 2;
  c.shape.tie_head = true;
  try {
    meshsim::validate_model_layout(c);
    ADD_FAILURE() << "--tie-head --pp 2 --zero 2 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "--tie-head with --pp 2 runs with --zero 0 or 1, not 2: the "
                                     "embedding group sums whole gradients; use --no-tie-head");
  }
}

// Context parallelism: a sequence that does not cut into 2·cp chunks (× tp with sequence
// parallel), an unknown --cp-comm and --cp on a model without a sequence are one line and exit
// 2; a cp run says its layout, keeps cp in config.json, and a run from that config.json is
// the same run (its losses equal, step by step).
TEST(CliMesh, ContextParallelChecksTrainsAndSurvivesConfigJson) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--model llama --gpus 4 --cp 4", "--seq-len 12 is not divisible by 2 × --cp 4 = 8"},
           {"--model gpt --gpus 4 --cp 2 --tp 2 --sequence-parallel",
            "--seq-len 12 is not divisible by 2 × --cp 2 × --tp 2 = 8"}}) {
    const auto out = fresh_dir("cp-bad");
    const auto r = run_meshsim("train --data synthetic --vocab 64 --hidden 32 --heads 4 "
                               "--seq-len 12 " + args + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
  expect_usage_error("--gpus 2 --cp 2 --cp-comm ring2", "unknown --cp-comm 'ring2' (choose allgather or ring)");
  expect_usage_error("--gpus 3 --cp 2", "--gpus 3 is not divisible by --tp 1 × --pp 1 × --cp 2 = 2");
  expect_usage_error("--gpus 2 --cp 0", "--cp must be at least 1, got 0");
  const auto out = fresh_dir("cp");
  const auto r = run_meshsim(kMeshGpt +
                             "--layers 2 --gpus 4 --cp 2 --cp-comm ring --batch-size 8 "
                             "--max-steps 4 --log-every 1 --eval-limit 16 --out " +
                             out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dp=2 × cp=2 × tp=1 × pp=1 (cp by ring)"), std::string::npos) << r.output;
  const auto config = read_json(out / "config.json");
  EXPECT_EQ(config["cp"], 2);
  EXPECT_EQ(config["cp_comm"], "ring");
  EXPECT_EQ(config["dp"], 2);
  EXPECT_EQ(read_json(out / "summary.json")["layout"]["cp"], 2);
  const auto again = fresh_dir("cp-again");
  const auto rerun =
      run_meshsim("train --config " + (out / "config.json").string() + " --out " + again.string());
  ASSERT_EQ(rerun.code, 0) << rerun.output;
  EXPECT_EQ(run_losses(again), run_losses(out));
  EXPECT_EQ(run_losses(out).size(), 4u);
  fs::remove_all(out);
  fs::remove_all(again);
}

// --pp-scatter-gather: refused in one line where tp ranks do not all hold the pipeline's
// messages whole (no tp, no pp, or sequence parallelism splitting them already); a run says it
// in its layout, sends half the bytes with tp 2, keeps the flag in config.json, and the same
// run without it reaches the same losses.
TEST(CliMesh, PipelineScatterGatherChecksTrainsAndSurvivesConfigJson) {
  const std::string needs = "--pp-scatter-gather splits the pipeline's messages, which every tp "
                            "rank holds whole, over tp: it needs --tp 2 or more and --pp 2 or "
                            "more without --sequence-parallel";
  expect_usage_error("--gpus 2 --pp 2 --pp-scatter-gather", needs + " (got --tp 1, --pp 2)");
  expect_usage_error("--gpus 2 --tp 2 --pp-scatter-gather", needs + " (got --tp 2, --pp 1)");
  expect_usage_error("--gpus 4 --tp 2 --pp 2 --sequence-parallel --pp-scatter-gather",
                     needs + " (got --tp 2, --pp 2, --sequence-parallel)");
  const std::string layout = kMeshGpt + "--gpus 4 --tp 2 --pp 2 --micro-batches 2 --batch-size 8 "
                                        "--max-steps 3 --log-every 1 --eval-limit 8 --out ";
  const auto whole = fresh_dir("ppsg-whole"), split = fresh_dir("ppsg");
  ASSERT_EQ(run_meshsim(layout + whole.string()).code, 0);
  const auto r = run_meshsim(layout + split.string() + " --pp-scatter-gather");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dp=1 × tp=2 × pp=2, pipeline messages scattered over tp"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(run_losses(split), run_losses(whole));
  EXPECT_EQ(read_json(split / "config.json")["pp_scatter_gather"], true);
  EXPECT_EQ(read_json(split / "summary.json")["layout"]["pp_scatter_gather"], true);
  // GPU 0 (stage 0) sends 6 activations of 4 samples × 16 tokens × 32 wide in fp32, whole or
  // half of them; its evaluation's 2 sends of 4 samples stay whole.
  const int64_t activation = 4 * 16 * 32 * 4, eval = 2 * activation;
  EXPECT_EQ(read_json(whole / "summary.json")["collectives"]["send"]["bytes"], 6 * activation + eval);
  EXPECT_EQ(read_json(split / "summary.json")["collectives"]["send"]["bytes"],
            6 * activation / 2 + eval);
  const auto again = fresh_dir("ppsg-again");
  const auto rerun =
      run_meshsim("train --config " + (split / "config.json").string() + " --out " + again.string());
  ASSERT_EQ(rerun.code, 0) << rerun.output;
  EXPECT_EQ(run_losses(again), run_losses(split));
  for (const auto& dir : {whole, split, again})
    fs::remove_all(dir);
}
