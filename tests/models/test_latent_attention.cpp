// DeepSeek-V3's shape in meshsim (models/layers/latent_attention.cpp, the sigmoid router of
// models/layers/moe.h, YaRN in rotary.h): the closed-form parameter count against the built
// model (on the CPU and on meta), and a tiny DeepSeek-V3 against transformers' own
// DeepseekV3ForCausalLM built from the same config.json with meshsim's weights
// (tests/models/hf_deepseek_reference.py): loss, logits and every gradient.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "../python_torch.h"
#include "base/safetensors.h"
#include "llama_reference.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "models/models.h"
#include "parallel/strategy.h"

using namespace meshsim;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace latent_attention_test {

// A DeepSeek-V3 of two dense layers' worth of size: q through its low rank, 8 experts in 4
// groups (the best 2 kept), top 2, one shared expert, a dense first layer, YaRN at factor 4
// from an original context of 16 with mscale (so the softmax's factor is 1.139²), interleaved
// rotary pairs. No balancing loss: transformers' model has none.
const char* kLowRankQ = R"({"model_type": "deepseek_v3", "hidden_size": 32,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "q_lora_rank": 24, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 12, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
    "norm_topk_prob": true, "aux_loss_alpha": 0.0, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 16,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})";

// q as one projection (q_lora_rank null), rotary in halves (rope_interleave false), no
// scaling, the top k not renormalised.
const char* kPlainQ = R"({"model_type": "deepseek_v3", "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "q_lora_rank": null, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 12, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
    "norm_topk_prob": false, "aux_loss_alpha": 0.0, "rope_theta": 10000.0,
    "rope_interleave": false})";

TransformerShape shape_of(const char* text) {
  return parse_hf_config(nlohmann::json::parse(text), "config.json").shape;
}

// transformers computes its RMSNorms, its rotary angles and its router in float32 even in a
// float64 model (DeepseekV3RMSNorm, DeepseekV3RotaryEmbedding and DeepseekV3TopkRouter cast
// to float32). Each of those roundings is at most u32 = 2^-24 = 6e-8 relative, the router's
// 32-term dot products and the angles (position ≤ 11 times a frequency ≤ 1) at most 32·u32 =
// 1.9e-6; a path from the tokens to a logit or back to a gradient crosses about 30 of them
// (three blocks' four norms, rotary of q and k, the router, then backward through the same),
// so 30 · 1.9e-6 = 5.7e-5 bounds the relative error. Far below what a mistake moves: dropping
// YaRN's softmax factor (1.139²) or the interleaving moves logits by percent.
constexpr double kTransformersFloat32Tolerance = 6e-5;

// Runs meshsim's model of `config` and transformers' on the same weights and tokens.
meshsim::testing::PyTorchComparison compare_with_transformers(const char* config, const std::string& what) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("meshsim-deepseek-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string config_file = (dir / "config.json").string();
  const std::string weights_file = (dir / "weights.safetensors").string();
  std::ofstream(config_file) << config;
  const TransformerShape s = shape_of(config);
  ModelOptions options{3, 0, s, torch::kFloat64};
  auto model = build_model("llama", options);
  std::vector<SafetensorsTensor> tensors;
  std::string order;
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor value = p.value().detach().contiguous();
    tensors.push_back({p.key(), "F64", value.sizes().vec(),
                       std::string(static_cast<const char*>(value.data_ptr()),
                                   static_cast<size_t>(value.numel()) * sizeof(double))});
    order += (order.empty() ? "" : ",") + p.key();
  }
  std::ofstream(weights_file, std::ios::binary) << safetensors_bytes(tensors, {{"order", order}});
  const int64_t batch = 2, t = 12;
  const std::vector<double> expected = meshsim::testing::numbers_printed_by(
      meshsim::testing::transformers_python() + " " MESHSIM_SOURCE_DIR "/tests/models/hf_deepseek_reference.py " +
      config_file + " " + weights_file + " " + std::to_string(batch) + " " + std::to_string(t));
  std::filesystem::remove_all(dir);
  const torch::Tensor logits =
      model->forward(meshsim::testing::fixed_tokens(batch, t, s.vocab, 7, 13, 3));
  const torch::Tensor loss =
      loss_fn(logits, meshsim::testing::fixed_tokens(batch, t, s.vocab, 5, 11, 1));
  loss.backward();
  return meshsim::testing::expect_matches_printed(expected, 0, loss, logits,
                                                  unique_parameters(*model),
                                                  kTransformersFloat32Tolerance, what);
}

TEST(LatentAttention, ParameterCountIsTheBuiltModels) {
  for (const char* config : {kLowRankQ, kPlainQ}) {
    ModelOptions options;
    options.shape = shape_of(config);
    EXPECT_EQ(count_parameters(*build_model("llama", options)),
              llama_parameter_count(options.shape));
    options.device = torch::kMeta;
    EXPECT_EQ(count_parameters(*build_model("llama", options)),
              llama_parameter_count(options.shape));
  }
}

TEST(LatentAttention, MatchesTransformersDeepseekV3) {
  if (!meshsim::testing::transformers_importable())
    GTEST_SKIP() << meshsim::testing::no_transformers();
  for (const auto& [config, what] : {std::pair{kLowRankQ, "q low rank, yarn, interleaved"},
                                     std::pair{kPlainQ, "q whole, plain rotary halves"}}) {
    const auto r = compare_with_transformers(config, what);
    std::cout << what << " vs transformers: loss " << r.loss << ", logits rel. error "
              << r.logit_error << ", worst gradient rel. error " << r.grad_error << "\n";
  }
}

// The fused core (the default of train and plan) on queries and keys wider than the values: the
// eager core's logits and gradients, float64 (kFloat64ModelTolerance, llama_reference.h).
TEST(LatentAttention, FusedCoreIsTheEagerOne) {
  const TransformerShape s = shape_of(kLowRankQ);
  const torch::Tensor tokens = meshsim::testing::fixed_tokens(2, 12, s.vocab, 7, 13, 3);
  const torch::Tensor targets = meshsim::testing::fixed_tokens(2, 12, s.vocab, 5, 11, 1);
  std::vector<std::vector<torch::Tensor>> grads;
  std::vector<torch::Tensor> logits;
  for (AttentionKind kind : {AttentionKind::Eager, AttentionKind::Fused}) {
    ModelOptions o{3, 0, s, torch::kFloat64};
    o.attention = kind;
    auto model = build_model("llama", o);
    logits.push_back(model->forward(tokens));
    loss_fn(logits.back(), targets).backward();
    grads.emplace_back();
    for (const auto& p : model->parameters())
      grads.back().push_back(p.grad().clone());
  }
  EXPECT_LT(meshsim::testing::norm_relative_error(logits[1].detach(), logits[0].detach()),
            meshsim::testing::kFloat64ModelTolerance);
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_LT(meshsim::testing::norm_relative_error(grads[1][i], grads[0][i]),
              meshsim::testing::kFloat64ModelTolerance)
        << "parameter " << i;
}

// YaRN and the interleaving change the model: the same weights without them give other logits
// (so the comparison above would see either dropped on one side). The attention projections are
// scaled by 10 so that at this init attention decides the logits, not only their last digits.
TEST(LatentAttention, YarnAndInterleavingChangeTheLogits) {
  const TransformerShape full = shape_of(kLowRankQ);
  const torch::Tensor tokens = meshsim::testing::fixed_tokens(1, 12, full.vocab, 7, 13, 3);
  const auto logits = [&](const TransformerShape& s) {
    ModelOptions o{3, 0, s, torch::kFloat64};
    auto model = build_model("llama", o);
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters())
      if (p.key().find(".attn.") != std::string::npos && p.value().dim() == 2)
        p.value().mul_(10);
    return model->forward(tokens);
  };
  const torch::Tensor reference = logits(full);
  TransformerShape unscaled = full;
  unscaled.rope_scaling = RopeScaling{};
  TransformerShape halves = full;
  halves.latent.interleave = false;
  for (const TransformerShape& s : {unscaled, halves}) {
    const double relative =
        ((logits(s) - reference).norm() / reference.norm()).item<double>();
    EXPECT_GT(relative, 100 * kTransformersFloat32Tolerance);
    std::cout << "logits moved by " << relative << " (relative)\n";
  }
}

} // namespace latent_attention_test
