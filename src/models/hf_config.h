// Hugging Face config.json as a model shape (`--hf-config FILE`, and the presets made from the
// published files): model_type llama, mistral, qwen2, qwen3, mixtral, qwen3_moe and deepseek_v3
// become a llama TransformerShape (with its mixture of experts, head width, biases, per-head q/k
// norms, Llama 3.1's or YaRN's rotary scaling, a tied head, and DeepSeek's multi-head latent
// attention and sigmoid router). Every key is read or refused: a key meshsim does
// not know, or a value it cannot honour (another activation, a sliding window, an unimplemented
// rotary scaling, ...), is one line naming the key.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/models.h"

namespace meshsim {

/// A model a config.json describes.
struct HfModel {
  std::string model_type; ///< config.json's model_type ("qwen3_moe")
  std::string family;     ///< meshsim's --model that builds it ("llama")
  TransformerShape shape; ///< seq_len is max_position_embeddings
};

/// The model `doc` describes; `where` starts every message ("config.json"). Throws
/// std::invalid_argument with one line naming the key for an unknown model_type, a missing or
/// mistyped key, a key meshsim does not know for that model_type, or a value it cannot build.
HfModel parse_hf_config(const nlohmann::json& doc, const std::string& where);

/// parse_hf_config of the file `path`, or of `path`/config.json when `path` is a folder. Throws
/// DataError for a file that cannot be read, JsonError for text that is not JSON (a key twice
/// included), std::invalid_argument as parse_hf_config.
HfModel read_hf_config(const std::string& path);

} // namespace meshsim
