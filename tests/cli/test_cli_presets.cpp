// `meshsim models` and the preset flags of `meshsim train`: the listing, the precedence of
// flags over a preset as config.json records it, and the one-line refusals with exit code 2.
#include <gtest/gtest.h>

#include <sstream>

#include "cli_harness.h"
#include "models/presets.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

// A one-step GPT run small enough for this machine.
const std::string kTiny =
    "train --data synthetic --synthetic-train 64 --synthetic-test 16 "
    "--eval-limit 16 --gpus 1 --strategy single --batch-size 4 --max-steps 1 ";

std::string line_with(const std::string& text, const std::string& part) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(part) != std::string::npos)
      return line;
  return "";
}

} // namespace

TEST(CliModels, TableListsEveryPresetWithItsCount) {
  const auto r = run_meshsim_exactly("models");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const meshsim::ModelPreset& p : meshsim::model_presets())
    EXPECT_NE(line_with(r.output, p.name + " "), "") << p.name << "\n" << r.output;
  // 96 layers of width 12288, V 51200, s 2048, tied: 174,615,846,912 (Narayanan's 174.6B).
  const std::string gpt175 = line_with(r.output, "gpt-175b ");
  EXPECT_NE(gpt175.find("174,615,846,912"), std::string::npos) << gpt175;
  EXPECT_NE(gpt175.find("174.6B"), std::string::npos) << gpt175;
  EXPECT_NE(gpt175.find("Korthikanti"), std::string::npos) << gpt175;
  const std::string llama = line_with(r.output, "llama3-8b ");
  EXPECT_NE(llama.find("8,030,261,248"), std::string::npos) << llama;
  EXPECT_NE(line_with(r.output, "gpt2 ").find("124.4M"), std::string::npos) << r.output;
}

TEST(CliModels, JsonHasTheSameFields) {
  const auto r = run_meshsim_exactly("models --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto doc = nlohmann::json::parse(r.output);
  ASSERT_TRUE(doc.is_array());
  ASSERT_EQ(doc.size(), meshsim::model_presets().size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const meshsim::ModelPreset& p = meshsim::model_presets()[i];
    const auto& e = doc[i];
    EXPECT_EQ(e["name"], p.name);
    EXPECT_EQ(e["family"], p.family);
    EXPECT_EQ(e["layers"], p.shape.layers);
    EXPECT_EQ(e["hidden"], p.shape.hidden);
    EXPECT_EQ(e["heads"], p.shape.heads);
    EXPECT_EQ(e["kv_heads"], meshsim::preset_kv_heads(p.shape));
    EXPECT_EQ(e["ffn_hidden"], meshsim::preset_ffn_hidden(p.family, p.shape));
    EXPECT_EQ(e["vocab"], p.shape.vocab);
    EXPECT_EQ(e["seq_len"], p.shape.seq_len);
    EXPECT_EQ(e["tie_head"], p.shape.tie_head);
    EXPECT_EQ(e["parameters"], meshsim::preset_parameter_count(p.family, p.shape));
    EXPECT_EQ(e["source"], p.source);
    EXPECT_EQ(e.contains("rope_theta"), p.family == "llama") << p.name;
  }
  nlohmann::json gpt175;
  for (const auto& e : doc)
    if (e["name"] == "gpt-175b")
      gpt175 = e;
  ASSERT_FALSE(gpt175.is_null());
  EXPECT_EQ(gpt175["parameters"], 174615846912);
  EXPECT_EQ(gpt175["ffn_hidden"], 4 * 12288);
}

// --preset gpt2 then five shape flags: config.json records the flags' values, the preset's
// tied head (no flag given) and the preset's name; --model gpt2 does the same.
TEST(CliModels, ShapeFlagsOverrideThePresetInConfigJson) {
  const std::string shape = "--layers 1 --hidden 32 --heads 2 --seq-len 32 --vocab 256 ";
  for (const std::string how : {"--preset gpt2 ", "--model gpt2 ", "--model gpt --preset gpt2 "}) {
    const auto out = fresh_dir("preset-override");
    const auto r = run_meshsim(kTiny + how + shape + "--out " + out.string());
    ASSERT_EQ(r.code, 0) << how << "\n" << r.output;
    EXPECT_NE(r.output.find("model gpt (preset gpt2)"), std::string::npos) << r.output;
    const auto c = read_json(out / "config.json");
    EXPECT_EQ(c["model"], "gpt") << how;
    EXPECT_EQ(c["preset"], "gpt2") << how;
    const auto& g = c["gpt"];
    EXPECT_EQ(g["layers"], 1);
    EXPECT_EQ(g["hidden"], 32);
    EXPECT_EQ(g["heads"], 2);
    EXPECT_EQ(g["seq_len"], 32);
    EXPECT_EQ(g["vocab"], 256);
    EXPECT_EQ(g["tie_head"], true) << "gpt2's tied head, no flag given";
    // V·H + S·H + L·(12H² + 13H) + 2H, tied: 8192 + 1024 + 12704 + 64.
    EXPECT_EQ(read_json(out / "summary.json")["parameters"], 21984);
    fs::remove_all(out);
  }
  // --no-tie-head overrides the preset's tie; --config keeps the file's shape and label, and
  // a flag still overrides it.
  const auto first = fresh_dir("preset-untied");
  auto r = run_meshsim(kTiny + "--preset gpt2 --no-tie-head " + shape + "--out " + first.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(first / "config.json")["gpt"]["tie_head"], false);
  const auto second = fresh_dir("preset-config");
  r = run_meshsim("train --config " + (first / "config.json").string() + " --layers 2 --out " +
                  second.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto c = read_json(second / "config.json");
  EXPECT_EQ(c["preset"], "gpt2");
  EXPECT_EQ(c["gpt"]["layers"], 2);
  EXPECT_EQ(c["gpt"]["hidden"], 32);
  EXPECT_EQ(c["gpt"]["tie_head"], false);
  fs::remove_all(first);
  fs::remove_all(second);
}

TEST(CliModels, BadPresetInputIsOneLineAndExitCode2) {
  const struct {
    std::string args, says;
  } cases[] = {
      {"--preset gpt-175", "unknown preset 'gpt-175' (nearest: gpt-175b"},
      {"--preset gpt-175", "meshsim models"},
      {"--model gpt-175", "unknown model 'gpt-175'"},
      {"--model cnn --preset gpt2", "--preset gpt2 is a gpt model, not --model cnn"},
      {"--model gpt2 --preset gpt-1t", "name two different presets"},
      {"--preset gpt2 --heads 5", "--hidden 768 is not divisible by --heads 5"},
      {"--model gpt --kv-heads 2", "grouped-query attention is llama's"},
      {"--model gpt --kv-heads 0", "--kv-heads"},
      {"--model gpt --ffn-hidden -3", "--ffn-hidden"},
      {"--model gpt --layers 0", "--layers must be positive, got 0"},
      {"--model gpt --rope-theta -1", "--rope-theta must be a positive finite number"},
      // A real-size preset is refused before anything is built (4 TB of float32 weights).
      {"--preset gpt-1t", "float32 weights"},
  };
  for (const auto& c : cases) {
    const auto r = run_meshsim("train --data synthetic " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "not one line: " << r.output;
  }
}
