// --hf-config's parser (models/hf_config.h): each model_type's keys become the shape the model
// type means in transformers, both rope layouts read the same, and every key meshsim cannot
// honour is refused in one line that names it.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "base/json_input.h"
#include "models/hf_config.h"
#include "models/llama.h"

using namespace meshsim;
using nlohmann::json;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace hf_config_test {

json llama3() {
  return json::parse(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
    "vocab_size": 128, "max_position_embeddings": 256, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": false,
    "attention_bias": false, "mlp_bias": false, "pretraining_tp": 1,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 1, "torch_dtype": "bfloat16"})");
}

json qwen3_moe() {
  return json::parse(R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "intermediate_size": 96, "moe_intermediate_size": 24, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [0], "vocab_size": 128, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "use_sliding_window": false,
    "sliding_window": null, "max_window_layers": 3, "router_aux_loss_coef": 0.001})");
}

// DeepSeek-V3's keys, small: multi-head latent attention, YaRN, the sigmoid router in groups.
json deepseek_v3() {
  return json::parse(R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96,
    "moe_intermediate_size": 24, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "seq_aux": true,
    "aux_loss_alpha": 0.001, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "num_nextn_predict_layers": 1, "ep_size": 1,
    "vocab_size": 128, "max_position_embeddings": 256, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "attention_bias": false, "pretraining_tp": 1,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 64,
                     "type": "yarn"},
    "quantization_config": {"quant_method": "fp8"}, "auto_map": {}})");
}

// The message of parse_hf_config's refusal of `doc` ("" when it accepts it).
std::string refusal(const json& doc) {
  try {
    parse_hf_config(doc, "config.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, LlamaWithLlama3Scaling) {
  const HfModel m = parse_hf_config(llama3(), "config.json");
  EXPECT_EQ(m.family, "llama");
  EXPECT_EQ(m.model_type, "llama");
  const TransformerShape& s = m.shape;
  EXPECT_EQ(s.hidden, 64);
  EXPECT_EQ(s.layers, 2);
  EXPECT_EQ(s.heads, 4);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.ffn_hidden, 96);
  EXPECT_EQ(s.vocab, 128);
  EXPECT_EQ(s.seq_len, 256);
  EXPECT_EQ(s.rope_theta, 500000);
  EXPECT_TRUE((s.rope_scaling == RopeScaling{8, 1, 4, 8192}));
  EXPECT_FALSE(s.qkv_bias || s.out_bias || s.qk_norm || s.tie_head);
  EXPECT_EQ(s.head_dim, 0);
  EXPECT_EQ(s.moe.experts, 0);
  json tied = llama3();
  tied["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_hf_config(tied, "config.json").shape.tie_head);
}

// transformers 5 keeps rope_theta and the scaling in rope_parameters: the same model.
TEST(HfConfig, BothRopeLayoutsReadTheSame) {
  json v5 = llama3();
  json rope = v5["rope_scaling"];
  rope["rope_theta"] = 500000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  v5["rope_parameters"] = rope;
  const TransformerShape a = parse_hf_config(llama3(), "a").shape;
  const TransformerShape b = parse_hf_config(v5, "b").shape;
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_TRUE(a.rope_scaling == b.rope_scaling);
  json plain = v5;
  plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000}};
  EXPECT_EQ(parse_hf_config(plain, "c").shape.rope_theta, 10000);
  EXPECT_EQ(parse_hf_config(plain, "c").shape.rope_scaling.factor, 0);
}

TEST(HfConfig, Qwen3MoeAndTheOtherTypes) {
  const TransformerShape s = parse_hf_config(qwen3_moe(), "config.json").shape;
  EXPECT_EQ(s.head_dim, 32); // 4 heads of 32 in a hidden of 64
  EXPECT_TRUE(s.qk_norm);
  EXPECT_EQ(s.norm_eps, 1e-6);
  EXPECT_EQ(s.moe.experts, 8);
  EXPECT_EQ(s.moe.top_k, 2);
  EXPECT_EQ(s.moe.ffn, 24);
  EXPECT_EQ(s.moe.dense_layers, 1);
  EXPECT_EQ(s.ffn_hidden, 96);
  EXPECT_TRUE(s.moe.normalize);
  EXPECT_EQ(s.moe.aux_loss, 0.001);

  json qwen2 = qwen3_moe();
  for (const char* key :
       {"head_dim", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
        "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef"})
    qwen2.erase(key);
  qwen2["model_type"] = "qwen2";
  const TransformerShape q2 = parse_hf_config(qwen2, "config.json").shape;
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.out_bias || q2.qk_norm);
  EXPECT_EQ(q2.moe.experts, 0);

  json mixtral = llama3();
  for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"})
    mixtral.erase(key);
  mixtral["model_type"] = "mixtral";
  mixtral["num_local_experts"] = 4;
  mixtral["num_experts_per_tok"] = 2;
  mixtral["sliding_window"] = nullptr;
  const TransformerShape mx = parse_hf_config(mixtral, "config.json").shape;
  EXPECT_EQ(mx.moe.experts, 4);
  EXPECT_EQ(mx.moe.ffn, 96); // intermediate_size is each expert's width
  EXPECT_EQ(mx.moe.dense_layers, 0);
  EXPECT_TRUE(mx.moe.normalize);

  const TransformerShape ds = parse_hf_config(deepseek_v3(), "config.json").shape;
  EXPECT_TRUE(ds.latent == (LatentShape{32, 16, 16, 8, 16, true}));
  EXPECT_EQ(ds.kv_heads, 0);
  EXPECT_TRUE(ds.rope_scaling.yarn);
  EXPECT_EQ(ds.rope_scaling.factor, 40);
  EXPECT_EQ(ds.rope_scaling.original_max, 64);
  EXPECT_EQ(ds.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(ds.moe.router, "sigmoid");
  EXPECT_EQ(ds.moe.groups, 4);
  EXPECT_EQ(ds.moe.top_groups, 2);
  EXPECT_EQ(ds.moe.shared_ffn, 24);
  EXPECT_EQ(ds.moe.dense_layers, 1);
  EXPECT_EQ(ds.moe.routed_scale, 2.5);
  EXPECT_EQ(ds.moe.aux_loss, 0.001);
  EXPECT_EQ(ds.ffn_hidden, 96);
}

// What meshsim cannot build, one line each, naming the key.
TEST(HfConfig, RefusesWhatItCannotHonourInOneLineNamingTheKey) {
  const auto with = [](json doc, const std::string& key, json value) {
    if (value.is_null() && key.rfind("-", 0) == 0)
      doc.erase(key.substr(1));
    else
      doc[key] = std::move(value);
    return doc;
  };
  json mistral = llama3();
  for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"})
    mistral.erase(key);
  mistral["model_type"] = "mistral";
  const std::vector<std::pair<json, std::string>> cases = {
      {with(llama3(), "model_type", "gpt_neox"), "model_type"},
      {with(deepseek_v3(), "num_key_value_heads", 2), "num_key_value_heads"},
      {with(deepseek_v3(), "scoring_func", "softmax"), "scoring_func"},
      {with(deepseek_v3(), "topk_method", "greedy"), "topk_method"},
      {with(deepseek_v3(), "attention_bias", true), "attention_bias"},
      {with(deepseek_v3(), "moe_layer_freq", 2), "moe_layer_freq"},
      {with(deepseek_v3(), "seq_aux", false), "seq_aux"},
      {with(deepseek_v3(), "n_group", 3), "n_group"},
      {with(deepseek_v3(), "qk_rope_head_dim", 7), "qk_rope_head_dim"},
      {with(deepseek_v3(), "first_k_dense_replace", 3), "first_k_dense_replace"},
      {with(deepseek_v3(), "-kv_lora_rank", nullptr), "kv_lora_rank"},
      {with(llama3(), "hidden_act", "gelu"), "hidden_act"},
      {with(llama3(), "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}),
       "original_max_position_embeddings"},
      {with(llama3(), "rope_scaling",
            {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
             {"attention_factor", 1.2}}),
       "attention_factor"},
      {with(llama3(), "rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}), "rope_type"},
      {with(llama3(), "rope_scaling", {{"type", "linear"}, {"factor", 4.0}}), "type"},
      {with(llama3(), "mlp_bias", true), "mlp_bias"},
      {with(llama3(), "attention_dropout", 0.1), "attention_dropout"},
      {with(llama3(), "hidden_size", "64"), "hidden_size"},
      {with(llama3(), "hidden_size", 0), "hidden_size"},
      {with(llama3(), "num_key_value_heads", 3), "num_key_value_heads"},
      {with(llama3(), "-rms_norm_eps", nullptr), "rms_norm_eps"},
      {mistral, "sliding_window"}, // absent: MistralConfig's default window of 4096
      {with(mistral, "sliding_window", 4096), "sliding_window"},
      {with(qwen3_moe(), "use_sliding_window", true), "use_sliding_window"},
      {with(qwen3_moe(), "mlp_only_layers", {1}), "mlp_only_layers"},
      {with(qwen3_moe(), "decoder_sparse_step", 2), "decoder_sparse_step"},
      {with(qwen3_moe(), "num_experts_per_tok", 9), "num_experts_per_tok"},
      {with(qwen3_moe(), "-head_dim", nullptr), "head_dim"},
      {with(qwen3_moe(), "shared_expert_intermediate_size", 64), "shared_expert_intermediate_size"},
      {with(llama3(), "odd\nkey", 1), "odd"}, // quoted printably: still one line
  };
  for (const auto& [doc, key] : cases) {
    const std::string line = refusal(doc);
    EXPECT_NE(line.find(key), std::string::npos) << key << ": " << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_EQ(line.rfind("config.json", 0), 0u) << line;
  }
  EXPECT_NE(refusal(json::array()), "");
}

// A file through the strict reader: a key twice is refused before the parser sees it.
TEST(HfConfig, AKeyTwiceIsRefusedByTheStrictReader) {
  EXPECT_THROW(parse_json(R"({"model_type": "llama", "model_type": "qwen2"})", "config.json"),
               JsonError);
}

} // namespace hf_config_test
