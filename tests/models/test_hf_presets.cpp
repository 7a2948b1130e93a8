// The presets parsed from published Hugging Face config.json files (models/hf_presets.cpp):
// each equals its file in the repository read by --hf-config's parser; its closed-form count
// (total and active) equals the model meshsim builds on meta; the published totals of
// PUBLISHED.md; and, where Python has transformers, the parameters transformers' own model of
// the same file has, built on meta (tests/models/hf_parameter_count.py). The last check runs on
// a small file of every model_type too, with what the presets lack (biases, a tied head, an
// explicit head_dim, dense first layers, no renormalisation).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "../python_torch.h"
#include "models/hf_config.h"
#include "models/layers/moe.h"
#include "models/llama.h"
#include "models/presets.h"

using namespace meshsim;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace hf_presets_test {

std::vector<const ModelPreset*> hf_config_presets() {
  std::vector<const ModelPreset*> out;
  for (const ModelPreset& p : model_presets())
    if (!p.hf_config.empty())
      out.push_back(&p);
  return out;
}

std::string source_file(const ModelPreset& p) {
  return std::string(MESHSIM_SOURCE_DIR) + "/" + p.hf_config;
}

// One small config.json per model_type, each with what the presets do not exercise.
std::vector<std::pair<std::string, std::string>> small_configs() {
  const std::string tiny = R"("hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 96,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "hidden_act": "silu", )";
  return {
      {"llama", "{" + tiny + R"("model_type": "llama", "attention_bias": true,
                                 "tie_word_embeddings": true})"},
      {"mistral", "{" + tiny + R"("model_type": "mistral", "sliding_window": null,
                                   "head_dim": 16})"},
      {"qwen2", "{" + tiny + R"("model_type": "qwen2", "use_sliding_window": false,
                                 "tie_word_embeddings": true})"},
      {"qwen3", "{" + tiny + R"("model_type": "qwen3", "head_dim": 24, "attention_bias": true,
                                 "use_sliding_window": false})"},
      {"mixtral", "{" + tiny + R"("model_type": "mixtral", "num_local_experts": 4,
                                   "num_experts_per_tok": 2, "sliding_window": null})"},
      {"qwen3_moe", "{" + tiny + R"("model_type": "qwen3_moe", "head_dim": 8, "num_experts": 4,
          "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": false,
          "mlp_only_layers": [0], "decoder_sparse_step": 1})"},
      // Multi-head latent attention without q's low rank (q_lora_rank null, as DeepSeek-V2-Lite),
      // values of another width, and YaRN in transformers 5's layout.
      {"deepseek_v3", R"({"model_type": "deepseek_v3", "hidden_size": 32, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 48,
          "vocab_size": 96, "max_position_embeddings": 64, "rms_norm_eps": 1e-06,
          "hidden_act": "silu", "q_lora_rank": null, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
          "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
          "n_shared_experts": 2, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
          "routed_scaling_factor": 2.5, "norm_topk_prob": true,
          "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 16, "mscale": 1.0,
                              "mscale_all_dim": 1.0}})"},
  };
}

TEST(HfPresets, EveryModelTypeFileIsAPreset) {
  std::vector<std::string> names;
  for (const ModelPreset* p : hf_config_presets())
    names.push_back(p->name);
  const std::vector<std::string> want = {"llama3.1-8b",    "llama3.1-70b",  "llama3.1-405b",
                                         "mixtral-8x7b",   "mixtral-8x22b", "qwen3-30b-a3b",
                                         "qwen3-235b-a22b", "deepseek-v3"};
  EXPECT_EQ(names, want);
}

// The binary's copy of each file is the repository's: the same shape either way.
TEST(HfPresets, EachIsItsFileParsed) {
  for (const ModelPreset* p : hf_config_presets()) {
    const HfModel m = read_hf_config(source_file(*p));
    EXPECT_EQ(p->family, m.family) << p->name;
    EXPECT_EQ(llama_parameter_count(p->shape), llama_parameter_count(m.shape)) << p->name;
    EXPECT_EQ(p->shape.hidden, m.shape.hidden) << p->name;
    EXPECT_EQ(p->shape.layers, m.shape.layers) << p->name;
    EXPECT_EQ(p->shape.seq_len, m.shape.seq_len) << p->name;
    EXPECT_EQ(p->shape.rope_theta, m.shape.rope_theta) << p->name;
    EXPECT_TRUE(p->shape.rope_scaling == m.shape.rope_scaling) << p->name;
    EXPECT_EQ(p->shape.norm_eps, m.shape.norm_eps) << p->name;
    EXPECT_EQ(p->shape.qk_norm, m.shape.qk_norm) << p->name;
    EXPECT_EQ(p->shape.moe.top_k, m.shape.moe.top_k) << p->name;
    EXPECT_EQ(p->shape.moe.normalize, m.shape.moe.normalize) << p->name;
    EXPECT_TRUE(p->shape.latent == m.shape.latent) << p->name;
  }
}

// The closed forms against the model built on meta (shapes only, nothing allocated): the total
// is count_parameters; the active count is the total less, per MoE layer, the share of its
// stacked experts' parameters that the E - k experts a token skips hold.
TEST(HfPresets, CountsAreTheModelBuiltOnMeta) {
  for (const ModelPreset* p : hf_config_presets()) {
    ModelOptions options;
    options.shape = p->shape;
    options.device = torch::kMeta;
    const torch::nn::Sequential model = build_model(p->family, options);
    const int64_t total = count_parameters(*model);
    EXPECT_EQ(preset_parameter_count(p->family, p->shape), total) << p->name;
    int64_t idle = 0;
    for (const auto& m : model->modules(false))
      if (const auto* moe = m->as<MoeImpl>()) {
        const int64_t e = p->shape.moe.experts, k = p->shape.moe.top_k;
        const int64_t experts =
            moe->expert_gate.numel() + moe->expert_up.numel() + moe->expert_down.numel();
        idle += experts / e * (e - k);
      }
    EXPECT_EQ(preset_active_parameter_count(p->family, p->shape), total - idle) << p->name;
    std::cout << p->name << ": " << total << " parameters, " << total - idle << " active\n";
  }
}

// PUBLISHED.md, "Model shapes of 2025-2026": the totals these files imply.
TEST(HfPresets, PublishedTotals) {
  EXPECT_EQ(preset_parameter_count("llama", find_preset("mixtral-8x7b")->shape), 46702792704);
  EXPECT_EQ(preset_parameter_count("llama", find_preset("qwen3-30b-a3b")->shape), 30532122624);
  EXPECT_EQ(preset_parameter_count("llama", find_preset("deepseek-v3")->shape), 671026404352);
}

// transformers' model of each file, on meta: the same total and active parameters.
TEST(HfPresets, TransformersBuildsTheSameCounts) {
  if (!meshsim::testing::transformers_importable())
    GTEST_SKIP() << meshsim::testing::no_transformers();
  const std::string python = meshsim::testing::transformers_python();
  std::string cmd = python + " " MESHSIM_SOURCE_DIR "/tests/models/hf_parameter_count.py";
  const std::vector<const ModelPreset*> presets = hf_config_presets();
  for (const ModelPreset* p : presets)
    cmd += " " + source_file(*p);
  const std::vector<double> counts = meshsim::testing::numbers_printed_by(cmd);
  ASSERT_EQ(counts.size(), 2 * presets.size()) << cmd;
  for (size_t i = 0; i < presets.size(); ++i) {
    const ModelPreset& p = *presets[i];
    // Below 2^53: exact in a double.
    EXPECT_EQ(preset_parameter_count(p.family, p.shape), static_cast<int64_t>(counts[2 * i]))
        << p.name;
    EXPECT_EQ(preset_active_parameter_count(p.family, p.shape),
              static_cast<int64_t>(counts[2 * i + 1]))
        << p.name;
    std::cout << p.name << ": transformers " << static_cast<int64_t>(counts[2 * i]) << " total, "
              << static_cast<int64_t>(counts[2 * i + 1]) << " active\n";
  }
}

// transformers' model of a small file of every model_type, on meta: the same total and active
// parameters as meshsim's shape of the same file.
TEST(HfPresets, TransformersBuildsTheSameCountsForEveryModelType) {
  if (!meshsim::testing::transformers_importable())
    GTEST_SKIP() << meshsim::testing::no_transformers();
  const std::string python = meshsim::testing::transformers_python();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("meshsim-hf-types-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string cmd = python + " " MESHSIM_SOURCE_DIR "/tests/models/hf_parameter_count.py";
  std::vector<HfModel> models;
  for (const auto& [type, text] : small_configs()) {
    const std::filesystem::path file = dir / (type + ".json");
    std::ofstream(file) << text;
    cmd += " " + file.string();
    models.push_back(read_hf_config(file.string()));
  }
  const std::vector<double> counts = meshsim::testing::numbers_printed_by(cmd);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(counts.size(), 2 * models.size()) << cmd;
  for (size_t i = 0; i < models.size(); ++i) {
    const HfModel& m = models[i];
    EXPECT_EQ(preset_parameter_count(m.family, m.shape), static_cast<int64_t>(counts[2 * i]))
        << m.model_type;
    EXPECT_EQ(preset_active_parameter_count(m.family, m.shape),
              static_cast<int64_t>(counts[2 * i + 1]))
        << m.model_type;
    std::cout << m.model_type << ": " << static_cast<int64_t>(counts[2 * i]) << " total, "
              << static_cast<int64_t>(counts[2 * i + 1]) << " active (transformers and meshsim)\n";
  }
}

} // namespace hf_presets_test
