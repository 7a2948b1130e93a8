// The llama's Hugging Face variants in a run's config.json (config/json.cpp): written only when
// set, so a plain model's file has none of their keys (and its fingerprint is what earlier
// versions wrote), and read back to the same configuration.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/config.h"

namespace meshsim {
namespace {

TEST(ConfigFileHf, PlainModelsWriteNoVariantKeys) {
  TrainConfig plain;
  plain.model = "llama";
  plain.data = "synthetic";
  validate(plain);
  const nlohmann::json saved = to_json(plain);
  EXPECT_FALSE(saved.contains("hf_config"));
  for (const char* key : {"head_dim", "qkv_bias", "out_bias", "qk_norm", "norm_eps", "rope_scaling"})
    EXPECT_FALSE(saved["gpt"].contains(key)) << key;
}

TEST(ConfigFileHf, VariantsRoundTrip) {
  TrainConfig c;
  c.model = "llama";
  c.data = "synthetic";
  c.hf_config = "some/Qwen3/config.json";
  c.shape.head_dim = 32;
  c.shape.qkv_bias = c.shape.out_bias = c.shape.qk_norm = true;
  c.shape.norm_eps = 1e-6;
  c.shape.rope_scaling = RopeScaling{8, 1, 4, 8192};
  validate(c);
  const nlohmann::json saved = to_json(c);
  EXPECT_EQ(saved["hf_config"], "some/Qwen3/config.json");
  EXPECT_EQ(saved["gpt"]["head_dim"], 32);
  EXPECT_EQ(saved["gpt"]["rope_scaling"]["original_max"], 8192);
  TrainConfig back = config_from_json(saved);
  validate(back);
  EXPECT_EQ(back.shape.head_dim, 32);
  EXPECT_TRUE(back.shape.qk_norm && back.shape.qkv_bias && back.shape.out_bias);
  EXPECT_EQ(back.shape.norm_eps, 1e-6);
  EXPECT_TRUE(back.shape.rope_scaling == c.shape.rope_scaling);
  EXPECT_EQ(to_json(back).dump(), saved.dump());
}

TEST(ConfigFileHf, VariantsOnTheGptAreRefused) {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.shape.qk_norm = true;
  try {
    validate(c);
    FAIL() << "a gpt with q/k norms was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("llama's"), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace meshsim
