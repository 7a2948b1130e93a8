// `--hf-config FILE` on the command line: train and plan take the model's shape from a Hugging
// Face config.json (or its folder), shape flags override its fields as they override a
// preset, config.json of the run records the result; what meshsim cannot build is one line and
// exit 2, a file that is not JSON exit 3.
#include <gtest/gtest.h>

#include <fstream>

#include "cli_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace hf_config_cli {

// A tiny Qwen3 (q/k norms, heads 16 wide in a hidden of 32) and a tiny Qwen3-MoE.
const char* kQwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 16, "intermediate_size": 48, "vocab_size": 256, "max_position_embeddings": 32,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "hidden_act": "silu",
  "tie_word_embeddings": false, "attention_bias": false, "use_sliding_window": false,
  "sliding_window": null, "max_window_layers": 2, "torch_dtype": "bfloat16"})";

std::string with_model_type(const std::string& type) {
  std::string text = kQwen3;
  const std::string from = "\"qwen3\"";
  text.replace(text.find(from), from.size(), "\"" + type + "\"");
  return text;
}

fs::path config_file(const std::string& name, const std::string& text) {
  const fs::path dir = fresh_dir("hf-config-" + name);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << text;
  return dir;
}

const std::string kTrainAnyLayout = "train --data synthetic --synthetic-train 64 "
                                    "--synthetic-test 16 --eval-limit 16 --batch-size 4 "
                                    "--max-steps 2 ";
const std::string kTrainOneGpu = kTrainAnyLayout + "--gpus 1 --strategy single ";

TEST(CliHfConfig, TrainsFromTheFolderAndRecordsTheShape) {
  const fs::path dir = config_file("qwen3", kQwen3);
  const fs::path out = fresh_dir("hf-config-run");
  const auto r = run_meshsim(kTrainOneGpu + "--hf-config " + dir.string() + " --layers 1 --out " +
                             out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto config = read_json(out / "config.json");
  EXPECT_EQ(config["model"], "llama");
  EXPECT_EQ(config["hf_config"], dir.string());
  EXPECT_EQ(config["gpt"]["layers"], 1); // the flag over the file's 2
  EXPECT_EQ(config["gpt"]["hidden"], 32);
  EXPECT_EQ(config["gpt"]["head_dim"], 16);
  EXPECT_EQ(config["gpt"]["qk_norm"], true);
  EXPECT_EQ(config["gpt"]["norm_eps"], 1e-6);
  EXPECT_EQ(config["gpt"]["seq_len"], 32);
}

TEST(CliHfConfig, PlansFromTheFile) {
  const fs::path dir = config_file("qwen3-plan", kQwen3);
  const auto r = run_meshsim("plan --hf-config " + (dir / "config.json").string() +
                             " --cluster 2xh100 --gpus 2 --batch-size 2");
  EXPECT_EQ(r.code, 0) << r.output;
}

// A preset parsed from its file plans too: Llama 3.1's scaled rotary frequencies on meta.
TEST(CliHfConfig, PlansAPresetWithLlama3Scaling) {
  const auto r = run_meshsim("plan --preset llama3.1-8b --cluster 8xh100 --zero 3 --precision "
                             "bf16 --global-batch-size 8 --seq-len 2048");
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST(CliBadInput, HfConfigRefusalsAreOneLineNamingTheKey) {
  const fs::path qwen3 = config_file("qwen3-bad", kQwen3);
  struct Case {
    std::string args, names;
    int code;
    std::string train = kTrainOneGpu;
  };
  const std::vector<Case> cases = {
      {"--hf-config " + config_file("gemma", with_model_type("gemma3")).string(), "model_type", 2},
      {"--hf-config " + config_file("deepseek", with_model_type("deepseek_v3")).string(),
       "num_key_value_heads", 2},
      {"--hf-config " + config_file("yarn", std::string(kQwen3).replace(
                                                std::string(kQwen3).find("\"rope_theta\""), 0,
                                                "\"rope_scaling\": {\"rope_type\": \"dynamic\", "
                                                "\"factor\": 4.0}, "))
                            .string(),
       "rope_type", 2},
      {"--hf-config " + qwen3.string() + " --preset llama3-8b", "--preset", 2},
      {"--hf-config " + qwen3.string() + " --model gpt", "--model gpt", 2},
      {"--hf-config " + qwen3.string() + " --gpus 2 --tp 2", "qk_norm", 2, kTrainAnyLayout},
      {"--hf-config " + config_file("not-json", "{\"model_type\": ").string(), "config.json", 3},
      {"--hf-config " + (qwen3 / "missing.json").string(), "missing.json", 3},
  };
  for (const Case& c : cases) {
    const auto r = run_meshsim(c.train + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

} // namespace hf_config_cli
