// `meshsim models`: every model preset with its shape, its parameter count (total, and active:
// what one token meets, top_k of each MoE layer's routed experts) and its source, as a table
// or (--json) as a JSON array with the same fields.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "models/family.h"
#include "models/presets.h"

namespace meshsim {

// 124439808 -> "124.4M", 174615846912 -> "174.6B": the rounding the papers use.
std::string short_count(int64_t n) {
  const std::pair<double, const char*> units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
  for (const auto& [scale, suffix] : units)
    if (static_cast<double>(n) >= scale)
      return fmt::format("{:.1f}{}", static_cast<double>(n) / scale, suffix);
  return std::to_string(n);
}

namespace {

// 174615846912 -> "174,615,846,912".
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

nlohmann::json preset_json(const ModelPreset& p) {
  const TransformerShape& s = p.shape;
  nlohmann::json j = {{"name", p.name},
                      {"family", p.family},
                      {"layers", s.layers},
                      {"hidden", s.hidden},
                      {"heads", s.heads},
                      {"kv_heads", preset_kv_heads(s)},
                      {"ffn_hidden", preset_ffn_hidden(p.family, s)},
                      {"vocab", s.vocab},
                      {"seq_len", s.seq_len},
                      {"tie_head", s.tie_head},
                      {"parameters", preset_parameter_count(p.family, s)},
                      {"active_parameters", preset_active_parameter_count(p.family, s)},
                      {"source", p.source}};
  if (s.moe.experts > 0)
    j["moe"] = {{"experts", s.moe.experts},
                {"top_k", s.moe.top_k},
                {"expert_ffn", s.moe.ffn},
                {"shared_ffn", s.moe.shared_ffn},
                {"dense_layers", s.moe.dense_layers}};
  if (s.head_dim > 0)
    j["head_dim"] = s.head_dim;
  if (!p.hf_config.empty())
    j["hf_config"] = p.hf_config;
  // Only a family with rotary embeddings (llama) has a theta; gpt's positions are learned.
  if (model_family(p.family).rotary)
    j["rope_theta"] = s.rope_theta;
  return j;
}

} // namespace

void add_models_flags(CLI::App& app, ModelsArgs& args) {
  app.add_flag("--json", args.json, "print a JSON array instead of the table");
}

int run_models(const ModelsArgs& args) {
  if (args.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const ModelPreset& p : model_presets())
      all.push_back(preset_json(p));
    fmt::print("{}\n", all.dump(2));
    return kExitOk;
  }
  const char* row = "{:<15} {:<6} {:>6} {:>6} {:>5} {:>3} {:>6} {:>7} {:>6} {:>6} {:<6} {:>7} "
                    "{:>17} {:>7} {:>17}  {}\n";
  fmt::print(row, "name", "family", "layers", "hidden", "heads", "kv", "ffn", "experts", "vocab",
             "seq", "head", "params", "exact", "active", "exact", "source");
  for (const ModelPreset& p : model_presets()) {
    const TransformerShape& s = p.shape;
    const int64_t n = preset_parameter_count(p.family, s);
    const int64_t active = preset_active_parameter_count(p.family, s);
    // An MoE preset's ffn column is each routed expert's width.
    const std::string ffn = std::to_string(
        s.moe.experts > 0 && s.moe.ffn > 0 ? s.moe.ffn : preset_ffn_hidden(p.family, s));
    const std::string experts =
        s.moe.experts > 0 ? fmt::format("{}/{}", s.moe.top_k, s.moe.experts) : "-";
    fmt::print(row, p.name, p.family, s.layers, s.hidden, s.heads, preset_kv_heads(s), ffn, experts,
               s.vocab, s.seq_len, s.tie_head ? "tied" : "untied", short_count(n), grouped(n),
               short_count(active), grouped(active), p.source);
  }
  fmt::print("experts: top k of the routed experts per token (ffn is then each expert's width); "
             "active: the parameters one token meets (dense, shared experts, router, top k "
             "experts).\nUse one as --model NAME or --preset NAME; the shape flags (--layers, "
             "--hidden, --heads, --kv-heads, --ffn-hidden, --seq-len, --vocab, --tie-head, "
             "--rope-theta, --moe-*) override its fields. See docs/presets.md.\n");
  return kExitOk;
}

} // namespace meshsim
