// The preset table and the closed-form parameter counts. Every shape is checked against its
// source, and the tests check each published parameter count against the formulas.
//
// The Megatron rows (Narayanan et al. SC'21, Korthikanti et al. 2022) tie the head to the
// token embedding: Megatron-LM shares them by default (untie_embeddings_and_output_weights is
// off), and the papers' parameter counts, 12lh²(1 + 13/(12h) + (V + s)/(12lh)), count V·h once;
// an untied head would add V·h (0.5 B at h = 10240), enough to change the 76.1 B row's
// rounding. GPT-2 ties too; Llama never does.
#include "models/presets.h"

#include <stdexcept>

#include "models/family.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace meshsim {
namespace {

// Narayanan and Korthikanti train every GPT at V = 51200 (GPT-2's BPE padded to a multiple
// of 1024 for tensor parallelism) and s = 2048.
constexpr int64_t kMegatronVocab = 51200;
constexpr int64_t kMegatronSeq = 2048;

ModelPreset megatron_gpt(const char* name, int64_t heads, int64_t hidden, int64_t layers,
                         const char* source) {
  TransformerShape s;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.vocab = kMegatronVocab;
  s.seq_len = kMegatronSeq;
  s.tie_head = true;
  return {name, "gpt", s, source};
}

ModelPreset llama(const char* name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t ffn_hidden, int64_t vocab, int64_t seq_len, double rope_theta,
                  const char* source) {
  TransformerShape s;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.ffn_hidden = ffn_hidden;
  s.vocab = vocab;
  s.seq_len = seq_len;
  s.rope_theta = rope_theta;
  s.tie_head = false;
  return {name, "llama", s, source};
}

std::vector<ModelPreset> make_presets() {
  TransformerShape gpt2;
  gpt2.layers = 12;
  gpt2.hidden = 768;
  gpt2.heads = 12;
  gpt2.vocab = 50257;
  gpt2.seq_len = 1024;
  gpt2.tie_head = true;
  return {
      {"gpt2", "gpt", gpt2,
       "GPT-2 small (Radford et al. 2019): openai-community/gpt2 config.json, tied head"},
      // Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
      // Using Megatron-LM", SC'21, Table 1: (heads a, hidden h, layers l).
      megatron_gpt("gpt-1.7b", 24, 2304, 24, "Narayanan et al. SC'21, Table 1 (1.7B)"),
      megatron_gpt("gpt-3.6b", 32, 3072, 30, "Narayanan et al. SC'21, Table 1 (3.6B)"),
      megatron_gpt("gpt-7.5b", 32, 4096, 36, "Narayanan et al. SC'21, Table 1 (7.5B)"),
      megatron_gpt("gpt-18.4b", 48, 6144, 40, "Narayanan et al. SC'21, Table 1 (18.4B)"),
      // Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
      // 2022, Table 3.
      megatron_gpt("gpt-22b", 64, 6144, 48, "Korthikanti et al. 2022, Table 3 (22B)"),
      megatron_gpt("gpt-39.1b", 64, 8192, 48, "Narayanan et al. SC'21, Table 1 (39.1B)"),
      megatron_gpt("gpt-76.1b", 80, 10240, 60, "Narayanan et al. SC'21, Table 1 (76.1B)"),
      megatron_gpt("gpt-145.6b", 96, 12288, 80, "Narayanan et al. SC'21, Table 1 (145.6B)"),
      megatron_gpt("gpt-175b", 96, 12288, 96,
                   "Korthikanti et al. 2022, Table 3 (175B, GPT-3's shape; 174.6B in Narayanan "
                   "et al. SC'21, Table 2)"),
      megatron_gpt("gpt-310.1b", 128, 16384, 96, "Narayanan et al. SC'21, Table 1 (310.1B)"),
      megatron_gpt("gpt-530b", 128, 20480, 105,
                   "Korthikanti et al. 2022, Table 3 (530B, MT-NLG); Narayanan et al. SC'21, "
                   "Table 1 (529.6B)"),
      megatron_gpt("gpt-1t", 160, 25600, 128,
                   "Narayanan et al. SC'21, Table 1 (1008.0B); Korthikanti et al. 2022, "
                   "Table 3 (1T)"),
      // Llama: (hidden, layers, heads, kv heads, intermediate size, vocabulary, context,
      // rope theta) as in Meta's config.json on Hugging Face and the papers' tables.
      llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000,
            "Touvron et al. 2023 (Llama 2), Table 1; meta-llama/Llama-2-7b-hf config.json"),
      llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, 500000,
            "meta-llama/Meta-Llama-3-8B config.json; Llama 3 Herd of Models (2024), Table 3"),
      llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256, 8192, 500000,
            "meta-llama/Meta-Llama-3-70B config.json; Llama 3 Herd of Models (2024), Table 3"),
      // Released as Llama 3.1 405B, whose config.json says 131072 positions: that is after
      // long-context training; 8192 is the sequence length of its pre-training (paper §3.4).
      llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256, 8192, 500000,
            "Llama 3 Herd of Models (2024), Table 3; meta-llama/Llama-3.1-405B config.json "
            "(vocab 128256); seq 8192 = its pre-training length"),
  };
}

} // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = [] {
    std::vector<ModelPreset> all = make_presets();
    for (ModelPreset& p : hf_presets())
      all.push_back(std::move(p));
    return all;
  }();
  return presets;
}

const ModelPreset* find_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name)
      return &p;
  return nullptr;
}

// One formula each, the models' own (models/gpt.h, models/llama.h).
int64_t preset_kv_heads(const TransformerShape& s) { return llama_kv_heads(s); }

int64_t preset_ffn_hidden(const std::string& family, const TransformerShape& s) {
  const ModelFamily* f = find_model_family(family);
  if (f && f->ffn_hidden)
    return f->ffn_hidden(s);
  return gpt_ffn_hidden(s);
}

int64_t preset_parameter_count(const std::string& family, const TransformerShape& s) {
  const ModelFamily* f = find_model_family(family);
  if (!f || !f->parameter_count)
    throw std::invalid_argument("no parameter count for model '" + family + "'");
  return f->parameter_count(s);
}

int64_t preset_active_parameter_count(const std::string& family, const TransformerShape& s) {
  const ModelFamily* f = find_model_family(family);
  if (f && f->active_parameter_count)
    return f->active_parameter_count(s);
  return preset_parameter_count(family, s);
}

} // namespace meshsim
