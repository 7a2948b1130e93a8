// Model presets: the published shapes of real transformers by name (`--preset gpt-175b`, or
// `--model llama3-8b`), and their parameter counts in closed form, so that a plan can name a
// model that could never be built here. Data and formulas only: resolving a preset against
// the command line's flags is config/config's job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/models.h"

namespace meshsim {

/// One published model shape.
struct ModelPreset {
  std::string name;   ///< what --preset and --model accept, e.g. "gpt-175b"
  std::string family; ///< the model it builds: "gpt" or "llama"
  /// layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, tie_head, rope_theta; a 0 in
  /// kv_heads or ffn_hidden means the family's default (preset_kv_heads, preset_ffn_hidden).
  TransformerShape shape;
  std::string source; ///< where the shape is published (paper and table, or model card)
  /// The repository's copy of the published config.json the shape is parsed from
  /// ("src/models/hf_configs/mixtral-8x7b.json"), or "" for a shape written out here.
  std::string hf_config = "";
};

/// The presets parsed from published Hugging Face config.json files (hf_presets.cpp), in the
/// order `meshsim models` lists them after the others.
std::vector<ModelPreset> hf_presets();

/// Every preset, in the order `meshsim models` lists them.
const std::vector<ModelPreset>& model_presets();

/// The preset called `name`, or nullptr.
const ModelPreset* find_preset(const std::string& name);

/// The key/value heads a model of `shape` has: kv_heads, or heads when 0.
int64_t preset_kv_heads(const TransformerShape& shape);

/// The MLP's inner width a `family` model of `shape` has (ModelFamily::ffn_hidden): ffn_hidden,
/// or when 0 the family's default: 4·hidden for gpt; for llama Meta's rule 256·ceil((8·hidden/3)/256) (the SwiGLU
/// width 2/3 of 4·hidden, rounded up to a multiple of 256), which gives Llama 2's 11008 at
/// hidden 4096.
int64_t preset_ffn_hidden(const std::string& family, const TransformerShape& shape);

/// Parameters of a `family` model of `shape` in closed form (int64; the caller keeps shapes
/// within validate's limit, far from overflow). gpt: gpt_parameter_count (models/gpt.h).
/// llama, with d = hidden/heads, kv = preset_kv_heads, F = preset_ffn_hidden:
///   V·H (embedding) + L·(H·(H + 2·kv·d) + H·H + 3·H·F + 2·H) + H (final norm) + V·H (head,
///   unless tied): q, k, v and o without biases, gate/up/down, two RMSNorm weights per layer.
/// (ModelFamily::parameter_count.) Throws std::invalid_argument for a family without one.
int64_t preset_parameter_count(const std::string& family, const TransformerShape& shape);

/// The parameters one token meets (ModelFamily::active_parameter_count): the dense ones, the
/// shared experts, the router and top_k routed experts of each MoE layer; the total for a
/// family without experts.
int64_t preset_active_parameter_count(const std::string& family, const TransformerShape& shape);

} // namespace meshsim
