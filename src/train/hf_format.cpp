// The Hugging Face families: each one's config.json and tensor names, both ways, and the reader
// that checks a config.json against a run. A family is a row (hf_families()), as
// models/family.h keeps meshsim's own: hf_folder.cpp reads rows and compares no model name.
#include "train/hf_format_families.h"

#include <fmt/format.h>

#include "base/errors.h"
#include "base/printable.h"

namespace meshsim {

// --- config.json --------------------------------------------------------------------------

void ConfigReader::differs(const std::string& key, const std::string& got,
                           const std::string& tail) const {
  throw std::invalid_argument(fmt::format("{} {} is {}; {}", where_, key, printable(got), tail));
}

int64_t ConfigReader::integer(const std::string& key) const {
  if (!doc_.contains(key))
    throw std::invalid_argument(fmt::format("{} has no {}", where_, key));
  if (!doc_[key].is_number_integer())
    throw DataError(
        fmt::format("{} {} is {}, not a whole number", where_, key, printable(doc_[key].dump())));
  return doc_[key].get<int64_t>();
}

void ConfigReader::expect(const std::string& key, int64_t want, const std::string& flag) const {
  if (const int64_t got = integer(key); got != want)
    differs(key, std::to_string(got), fmt::format("this run's {} is {}", flag, want));
}

void ConfigReader::expect_or_null(const std::string& key, int64_t want, int64_t fallback,
                                  const std::string& flag) const {
  const int64_t got = !doc_.contains(key) || doc_[key].is_null() ? fallback : integer(key);
  if (got != want)
    differs(key, std::to_string(got), fmt::format("this run's {} is {}", flag, want));
}

void ConfigReader::expect_bool(const std::string& key, bool want, bool fallback,
                               const std::string& why) const {
  bool got = fallback;
  if (doc_.contains(key)) {
    if (!doc_[key].is_boolean())
      throw DataError(
          fmt::format("{} {} is {}, not true or false", where_, key, printable(doc_[key].dump())));
    got = doc_[key].get<bool>();
  }
  if (got != want)
    differs(key, got ? "true" : "false",
            why.empty()     ? fmt::format("meshsim's model needs {}", want ? "true" : "false")
            : why[0] == '-' ? "this run has " + (want ? why : "--no-" + why.substr(2))
                            : why);
}

void ConfigReader::expect_text(const std::string& key, const std::string& want,
                               const std::string& fallback, const std::string& why) const {
  std::string got = fallback;
  if (doc_.contains(key)) {
    if (!doc_[key].is_string())
      throw DataError(
          fmt::format("{} {} is {}, not text", where_, key, printable(doc_[key].dump())));
    got = doc_[key].get<std::string>();
  }
  if (got != want)
    differs(key, "\"" + got + "\"", why);
}

void ConfigReader::expect_number(const std::string& key, double want, double fallback,
                                 const std::string& why) const {
  double got = fallback;
  if (doc_.contains(key)) {
    if (!doc_[key].is_number())
      throw DataError(
          fmt::format("{} {} is {}, not a number", where_, key, printable(doc_[key].dump())));
    got = doc_[key].get<double>();
  }
  if (got != want)
    differs(key, fmt::format("{}", got), why);
}

void ConfigReader::expect_rope_theta(double want) const {
  if (doc_.contains("rope_scaling") && !doc_["rope_scaling"].is_null())
    differs("rope_scaling", doc_["rope_scaling"].dump(), "meshsim's rotary embedding is unscaled");
  double got = 10000;
  if (doc_.contains("rope_parameters") && !doc_["rope_parameters"].is_null()) {
    const auto& rope = doc_["rope_parameters"];
    if (!rope.is_object())
      throw DataError(where_ + " rope_parameters is not an object");
    ConfigReader inner(rope, where_ + " rope_parameters'");
    inner.expect_text("rope_type", "default", "default", "meshsim's rotary embedding is unscaled");
    if (rope.contains("rope_theta")) {
      if (!rope["rope_theta"].is_number())
        throw DataError(where_ + " rope_parameters' rope_theta is not a number");
      got = rope["rope_theta"].get<double>();
    }
  } else if (doc_.contains("rope_theta")) {
    if (!doc_["rope_theta"].is_number())
      throw DataError(where_ + " rope_theta is not a number");
    got = doc_["rope_theta"].get<double>();
  }
  if (got != want)
    differs("rope_theta", fmt::format("{}", got),
            fmt::format("this run's --rope-theta is {}", want));
}

namespace {

using hf_json = nlohmann::ordered_json;

torch::Tensor hf_tensor(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [key, value] : tensors)
    if (key == name)
      return value;
  throw std::invalid_argument("no tensor " + name);
}

// --- GPT-2 ---------------------------------------------------------------------------------
// Conv1D keeps its weight as [in, out] (x @ W + b): meshsim's Linear [out, in] transposed.
// c_attn is q, k and v side by side along the output, in that order (GPT2Attention splits
// it so).

hf_json gpt2_config(const TransformerShape& s, const std::string& dtype) {
  return hf_json{{"architectures", {"GPT2LMHeadModel"}},
                 {"model_type", "gpt2"},
                 {"vocab_size", s.vocab},
                 {"n_positions", s.seq_len},
                 {"n_embd", s.hidden},
                 {"n_layer", s.layers},
                 {"n_head", s.heads},
                 {"n_inner", s.ffn_hidden > 0 ? s.ffn_hidden : 4 * s.hidden},
                 {"activation_function", "gelu"}, // exact: meshsim's GELU is erf's
                 {"resid_pdrop", 0.0},
                 {"embd_pdrop", 0.0},
                 {"attn_pdrop", 0.0},
                 {"layer_norm_epsilon", 1e-5},
                 {"initializer_range", 0.02},
                 {"scale_attn_weights", true},
                 {"scale_attn_by_inverse_layer_idx", false},
                 {"reorder_and_upcast_attn", false},
                 {"tie_word_embeddings", s.tie_head},
                 {"bos_token_id", nullptr}, // byte-level text has no special tokens
                 {"eos_token_id", nullptr},
                 {"dtype", dtype},
                 {"torch_dtype", dtype}}; // transformers 4.x reads this name
}

void gpt2_check(const ConfigReader& r, const TransformerShape& s) {
  r.expect("n_layer", s.layers, "--layers");
  r.expect("n_embd", s.hidden, "--hidden");
  r.expect("n_head", s.heads, "--heads");
  r.expect("n_positions", s.seq_len, "--seq-len");
  r.expect("vocab_size", s.vocab, "--vocab");
  r.expect_or_null("n_inner", s.ffn_hidden > 0 ? s.ffn_hidden : 4 * s.hidden,
                   4 * r.integer("n_embd"), "--ffn-hidden");
  r.expect_bool("tie_word_embeddings", s.tie_head, true, "--tie-head");
  r.expect_text("activation_function", "gelu", "gelu_new",
                "meshsim's GPT uses the exact GELU (\"gelu\")");
  r.expect_number("layer_norm_epsilon", 1e-5, 1e-5, "meshsim's LayerNorm eps is 1e-05");
  r.expect_bool("scale_attn_weights", true, true, "");
  r.expect_bool("scale_attn_by_inverse_layer_idx", false, false, "");
  r.expect_bool("add_cross_attention", false, false, "");
}

// One block's tensors in GPT-2's order: meshsim's name, GPT-2's, and how they relate. q, k
// and v have no row of their own: they are c_attn's three parts.
enum class Gpt2Kind { kSame, kConv1d, kFusedQkv };
struct Gpt2Name {
  const char* mine; // for kFusedQkv, the suffix after "attn.q."
  const char* theirs;
  Gpt2Kind kind;
};

const std::vector<Gpt2Name>& gpt2_block_names() {
  static const std::vector<Gpt2Name> names = {
      {"ln1.weight", "ln_1.weight", Gpt2Kind::kSame},
      {"ln1.bias", "ln_1.bias", Gpt2Kind::kSame},
      {"weight", "attn.c_attn.weight", Gpt2Kind::kFusedQkv},
      {"bias", "attn.c_attn.bias", Gpt2Kind::kFusedQkv},
      {"attn.out.weight", "attn.c_proj.weight", Gpt2Kind::kConv1d},
      {"attn.out.bias", "attn.c_proj.bias", Gpt2Kind::kSame},
      {"ln2.weight", "ln_2.weight", Gpt2Kind::kSame},
      {"ln2.bias", "ln_2.bias", Gpt2Kind::kSame},
      {"mlp.fc.weight", "mlp.c_fc.weight", Gpt2Kind::kConv1d},
      {"mlp.fc.bias", "mlp.c_fc.bias", Gpt2Kind::kSame},
      {"mlp.proj.weight", "mlp.c_proj.weight", Gpt2Kind::kConv1d},
      {"mlp.proj.bias", "mlp.c_proj.bias", Gpt2Kind::kSame}};
  return names;
}

// The tensors outside the blocks, each kept as it is.
std::vector<std::pair<std::string, std::string>> gpt2_outer_names(const TransformerShape& s,
                                                                  bool last) {
  if (!last)
    return {{"embed.wte", "transformer.wte.weight"}, {"embed.wpe", "transformer.wpe.weight"}};
  std::vector<std::pair<std::string, std::string>> names = {
      {"ln_f.weight", "transformer.ln_f.weight"}, {"ln_f.bias", "transformer.ln_f.bias"}};
  if (!s.tie_head)
    names.emplace_back("head.weight", "lm_head.weight");
  return names;
}

// meshsim's names to GPT-2's when `to_hf`, else back: the same table read both ways.
NamedTensors gpt2_convert(const NamedTensors& in, const TransformerShape& s, bool to_hf) {
  NamedTensors out;
  auto plain = [&](const std::string& mine, const std::string& theirs, bool transposed) {
    const torch::Tensor t = hf_tensor(in, to_hf ? mine : theirs);
    out.emplace_back(to_hf ? theirs : mine, (transposed ? t.t() : t).contiguous());
  };
  for (const auto& [mine, theirs] : gpt2_outer_names(s, false))
    plain(mine, theirs, false);
  const char* parts[] = {"q", "k", "v"};
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string b = fmt::format("block{}.", l), h = fmt::format("transformer.h.{}.", l);
    for (const Gpt2Name& n : gpt2_block_names()) {
      if (n.kind != Gpt2Kind::kFusedQkv) {
        plain(b + n.mine, h + n.theirs, n.kind == Gpt2Kind::kConv1d);
        continue;
      }
      const bool weight = std::string(n.mine) == "weight"; // Conv1D: [in, 3 out]
      if (to_hf) {
        std::vector<torch::Tensor> qkv;
        for (const char* p : parts)
          qkv.push_back(hf_tensor(in, b + "attn." + p + "." + n.mine));
        const torch::Tensor fused = torch::cat(qkv);
        out.emplace_back(h + n.theirs, (weight ? fused.t() : fused).contiguous());
        continue;
      }
      const torch::Tensor fused = hf_tensor(in, h + n.theirs);
      const auto qkv = (weight ? fused.t() : fused).chunk(3, 0);
      for (size_t i = 0; i < 3; ++i)
        out.emplace_back(b + "attn." + parts[i] + "." + n.mine, qkv[i].contiguous());
    }
  }
  for (const auto& [mine, theirs] : gpt2_outer_names(s, true))
    plain(mine, theirs, false);
  return out;
}

NamedTensors gpt2_to_hf(const NamedTensors& m, const TransformerShape& s) {
  return gpt2_convert(m, s, true);
}

NamedTensors gpt2_from_hf(const NamedTensors& hf, const TransformerShape& s) {
  return gpt2_convert(hf, s, false);
}

// --- Llama ---------------------------------------------------------------------------------
// The names map one to one, every weight as nn.Linear keeps it ([out, in]).

int64_t hf_kv_heads(const TransformerShape& s) {
  return s.kv_heads > 0 ? s.kv_heads : s.heads;
}

const std::vector<std::pair<std::string, std::string>>& llama_block_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn.q.weight", "self_attn.q_proj.weight"},
      {"attn.k.weight", "self_attn.k_proj.weight"},
      {"attn.v.weight", "self_attn.v_proj.weight"},
      {"attn.o.weight", "self_attn.o_proj.weight"},
      {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"mlp.gate.weight", "mlp.gate_proj.weight"},
      {"mlp.up.weight", "mlp.up_proj.weight"},
      {"mlp.down.weight", "mlp.down_proj.weight"}};
  return names;
}

std::vector<std::pair<std::string, std::string>> llama_names(const TransformerShape& s) {
  std::vector<std::pair<std::string, std::string>> names = {
      {"embed.wte", "model.embed_tokens.weight"}};
  for (int64_t l = 0; l < s.layers; ++l)
    for (const auto& [mine, theirs] : llama_block_names())
      names.emplace_back(fmt::format("block{}.{}", l, mine),
                         fmt::format("model.layers.{}.{}", l, theirs));
  names.emplace_back("norm_f.weight", "model.norm.weight");
  names.emplace_back("head.weight", "lm_head.weight");
  return names;
}

// The Llama is written as LlamaForCausalLM without its Hugging Face variants (models/hf_config.h):
// a model with them is refused in one line rather than written as another model.
void require_plain_llama(const TransformerShape& s) {
  const TransformerShape plain;
  if (s.head_dim > 0 || s.qkv_bias || s.out_bias || s.qk_norm || s.norm_eps != plain.norm_eps ||
      s.rope_scaling.factor > 0 || s.tie_head || s.latent.kv_rank > 0 || s.moe.experts > 0)
    throw std::invalid_argument(
        "the Hugging Face folder meshsim writes and reads is the plain LlamaForCausalLM: this "
        "model's head_dim, attention biases, q/k norms, norm_eps, rope scaling, tied head, "
        "latent attention or mixture of experts (from --hf-config or --moe-*) are not in it yet");
}

hf_json llama_config(const TransformerShape& s, const std::string& dtype) {
  require_plain_llama(s);
  return hf_json{{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"vocab_size", s.vocab},
                 {"hidden_size", s.hidden},
                 {"intermediate_size", s.ffn_hidden}, // resolved by the caller
                 {"num_hidden_layers", s.layers},
                 {"num_attention_heads", s.heads},
                 {"num_key_value_heads", hf_kv_heads(s)},
                 {"head_dim", s.hidden / s.heads},
                 {"hidden_act", "silu"},
                 {"max_position_embeddings", s.seq_len},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", s.rope_theta}, // transformers 4.x
                 {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", s.rope_theta}}},
                 {"attention_bias", false},
                 {"attention_dropout", 0.0},
                 {"mlp_bias", false},
                 {"pretraining_tp", 1},
                 {"initializer_range", 0.02},
                 {"tie_word_embeddings", false},
                 {"bos_token_id", nullptr},
                 {"eos_token_id", nullptr},
                 {"dtype", dtype},
                 {"torch_dtype", dtype}};
}

void llama_check(const ConfigReader& r, const TransformerShape& s) {
  require_plain_llama(s);
  r.expect("num_hidden_layers", s.layers, "--layers");
  r.expect("hidden_size", s.hidden, "--hidden");
  r.expect("num_attention_heads", s.heads, "--heads");
  r.expect_or_null("num_key_value_heads", hf_kv_heads(s), r.integer("num_attention_heads"),
                   "--kv-heads");
  r.expect("intermediate_size", s.ffn_hidden, "--ffn-hidden");
  r.expect("vocab_size", s.vocab, "--vocab");
  r.expect_or_null("head_dim", s.hidden / s.heads,
                   r.integer("hidden_size") / r.integer("num_attention_heads"),
                   "--hidden / --heads");
  r.expect_text("hidden_act", "silu", "silu", "meshsim's Llama uses SwiGLU (\"silu\")");
  r.expect_number("rms_norm_eps", 1e-5, 1e-6, "meshsim's RMSNorm eps is 1e-05");
  r.expect_bool("tie_word_embeddings", false, false, "meshsim's Llama has an untied head");
  r.expect_bool("attention_bias", false, false, "");
  r.expect_bool("mlp_bias", false, false, "");
  r.expect_rope_theta(s.rope_theta);
}

NamedTensors llama_to_hf(const NamedTensors& m, const TransformerShape& s) {
  require_plain_llama(s);
  NamedTensors out;
  for (const auto& [mine, theirs] : llama_names(s))
    out.emplace_back(theirs, hf_tensor(m, mine).contiguous());
  return out;
}

NamedTensors llama_from_hf(const NamedTensors& hf, const TransformerShape& s) {
  require_plain_llama(s);
  NamedTensors out;
  for (const auto& [mine, theirs] : llama_names(s))
    out.emplace_back(mine, hf_tensor(hf, theirs).contiguous());
  return out;
}

} // namespace

const std::vector<HfFamily>& hf_families() {
  static const std::vector<HfFamily> families = {
      {"gpt",
       "GPT2LMHeadModel",
       "gpt2",
       gpt2_config,
       gpt2_check,
       gpt2_to_hf,
       gpt2_from_hf,
       // GPT2Attention's causal-mask buffers, which older files hold
       {".attn.bias", ".attn.masked_bias"}},
      {"llama",
       "LlamaForCausalLM",
       "llama",
       llama_config,
       llama_check,
       llama_to_hf,
       llama_from_hf,
       {".rotary_emb.inv_freq"}},
  };
  return families;
}

const HfFamily* find_hf_family(const std::string& model) {
  for (const auto& f : hf_families())
    if (f.model == model)
      return &f;
  return nullptr;
}

} // namespace meshsim
