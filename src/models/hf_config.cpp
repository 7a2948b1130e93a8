// config.json to a llama shape. A Keys reader hands out each key once and remembers it; after a
// model_type's keys are read, any key left is refused, so a file never silently means more
// than meshsim builds. Values transformers would default are required where its defaults differ
// between model types or versions (num_key_value_heads, rms_norm_eps, rope_theta, qwen3's
// head_dim): the file must say.
#include "models/hf_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"

namespace meshsim {
namespace {

using nlohmann::json;

// Keys that only name, tokenize or store the model: they change nothing meshsim builds.
const std::set<std::string>& metadata_keys() {
  static const std::set<std::string> keys = {
      "architectures",     "bos_token_id",  "eos_token_id",         "pad_token_id",
      "torch_dtype",       "dtype",         "transformers_version", "use_cache",
      "initializer_range", "_name_or_path", "output_router_logits",
      // Where the remote code lives, and how the checkpoint's weights are stored (DeepSeek-V3's
      // FP8 blocks): neither changes the model meshsim trains (its dtype is --precision).
      "auto_map",          "quantization_config"};
  return keys;
}

class Keys {
public:
  Keys(const json& doc, std::string where) : doc_(doc), where_(std::move(where)) {}

  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    throw std::invalid_argument(fmt::format("{} {}: {}", where_, printable(key), why));
  }
  std::string shown(const std::string& key) const { return printable(doc_.at(key).dump()); }

  // The key's value, marked read; nullptr when absent or null.
  const json* find(const std::string& key) {
    read_.insert(key);
    const auto it = doc_.find(key);
    return it == doc_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer(const std::string& key, int64_t fallback = -1, int64_t min = 1) {
    const json* v = find(key);
    if (!v) {
      if (fallback < 0)
        refuse(key, "is missing (meshsim takes no model type's default for it)");
      return fallback;
    }
    if (!v->is_number_integer())
      refuse(key, fmt::format("is {}, not a whole number", shown(key)));
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{1} << 40)
      refuse(key, fmt::format("is {}, larger than any model meshsim builds", shown(key)));
    const int64_t n = v->get<int64_t>();
    if (n < min || n > int64_t{1} << 40)
      refuse(key, fmt::format("is {}; meshsim needs a whole number from {}", n, min));
    return n;
  }

  double number(const std::string& key,
                double fallback = std::numeric_limits<double>::quiet_NaN()) {
    const json* v = find(key);
    if (!v) {
      if (std::isnan(fallback))
        refuse(key, "is missing (meshsim takes no model type's default for it)");
      return fallback;
    }
    if (!v->is_number())
      refuse(key, fmt::format("is {}, not a number", shown(key)));
    const double x = v->get<double>();
    if (!std::isfinite(x) || !(x > 0))
      refuse(key, fmt::format("is {}; meshsim needs a positive number", shown(key)));
    return x;
  }

  bool boolean(const std::string& key, bool fallback) {
    const json* v = find(key);
    if (!v)
      return fallback;
    if (!v->is_boolean())
      refuse(key, fmt::format("is {}, not true or false", shown(key)));
    return v->get<bool>();
  }

  std::string text(const std::string& key, const std::string& fallback) {
    const json* v = find(key);
    if (!v)
      return fallback;
    if (!v->is_string())
      refuse(key, fmt::format("is {}, not text", shown(key)));
    return v->get<std::string>();
  }

  // A key whose value must be `want` (absent or null: `fallback`) for meshsim to build it.
  void require_bool(const std::string& key, bool want, bool fallback, const std::string& why) {
    if (boolean(key, fallback) != want)
      refuse(key, fmt::format("is {}; {}", want ? "false" : "true", why));
  }
  void require_zero(const std::string& key, const std::string& why) {
    const json* v = find(key);
    if (v && !(v->is_number() && v->get<double>() == 0))
      refuse(key, fmt::format("is {}; {}", shown(key), why));
  }
  // Null or absent: a key whose every value turns on something meshsim does not have.
  void require_null(const std::string& key, const std::string& why, bool absent_is_null = true) {
    if (!doc_.contains(key) && !absent_is_null)
      refuse(key,
             "is missing, which means its default of this model type; " + why + " (write null)");
    if (find(key))
      refuse(key, fmt::format("is {}; {}", shown(key), why));
  }

  // Every key neither read nor metadata: refused.
  // `context` names what the keys belong to ("model_type llama").
  void refuse_unread(const std::string& context) const {
    for (const auto& item : doc_.items())
      if (!read_.count(item.key()) && !metadata_keys().count(item.key()))
        refuse(item.key(), fmt::format("is not a key meshsim knows for {}, so it cannot tell "
                                       "what the model does with it",
                                       context));
  }

  const json& doc() const { return doc_; }
  const std::string& where() const { return where_; }

private:
  const json& doc_;
  std::string where_;
  std::set<std::string> read_;
};

// rope_theta and the scaling, in transformers 4's layout (rope_theta, rope_scaling) or 5's
// (rope_parameters holding both).
void read_rope(Keys& k, TransformerShape& s) {
  const json* parameters = k.find("rope_parameters");
  const bool top_theta = k.doc().contains("rope_theta") && !k.doc()["rope_theta"].is_null();
  const json* scaling = k.find("rope_scaling");
  if (parameters && scaling)
    k.refuse("rope_scaling", "is given beside rope_parameters, which holds the scaling too");
  const json* rope = parameters ? parameters : scaling;
  const std::string name = parameters ? "rope_parameters" : "rope_scaling";
  if (parameters && !top_theta)
    k.find("rope_theta");
  else
    s.rope_theta = k.number("rope_theta");
  if (!rope)
    return;
  if (!rope->is_object())
    k.refuse(name, fmt::format("is {}, not an object", k.shown(name)));
  Keys r(*rope, k.where() + " " + name + "'s");
  if (parameters) {
    const double theta = r.number("rope_theta");
    if (top_theta && theta != s.rope_theta)
      k.refuse("rope_theta",
               fmt::format("is {}, and rope_parameters' rope_theta {}", s.rope_theta, theta));
    s.rope_theta = theta;
  }
  // transformers 4.x wrote "type" before "rope_type".
  const bool old_name = rope->contains("type") && !rope->contains("rope_type");
  const std::string type = old_name ? r.text("type", "default") : r.text("rope_type", "default");
  if (type == "llama3") {
    s.rope_scaling.factor = r.number("factor");
    s.rope_scaling.low_freq_factor = r.number("low_freq_factor");
    s.rope_scaling.high_freq_factor = r.number("high_freq_factor");
    s.rope_scaling.original_max = r.integer("original_max_position_embeddings");
    if (!(s.rope_scaling.high_freq_factor > s.rope_scaling.low_freq_factor))
      r.refuse("high_freq_factor", "must be above low_freq_factor");
  } else if (type == "yarn") {
    RopeScaling& y = s.rope_scaling;
    y.yarn = true;
    y.factor = r.number("factor");
    y.original_max = r.integer("original_max_position_embeddings");
    y.beta_fast = r.number("beta_fast", 32);
    y.beta_slow = r.number("beta_slow", 1);
    y.mscale = r.number("mscale", 0);
    y.mscale_all_dim = r.number("mscale_all_dim", 0);
    if (!(y.beta_fast > y.beta_slow))
      r.refuse("beta_fast", "must be above beta_slow");
    r.require_null("attention_factor",
                   "meshsim derives YaRN's attention factor from factor, mscale and "
                   "mscale_all_dim");
    r.require_bool("truncate", true, true, "meshsim's YaRN ramp starts and ends at whole pairs");
  } else if (type != "default") {
    r.refuse(old_name ? "type" : "rope_type",
             fmt::format("is \"{}\"; meshsim's rotary embedding is unscaled or scaled as Llama "
                         "3.1 (llama3) or YaRN (yarn)",
                         printable(type)));
  }
  r.refuse_unread("rope_type " + type);
}

// What every model type shares: the sizes, the activation, the norms, the head, rotary.
// `latent`: the heads' widths are multi-head latent attention's own keys, not hidden / heads.
void read_common(Keys& k, TransformerShape& s, bool explicit_head_dim, bool head_dim_required,
                 bool latent = false) {
  s.hidden = k.integer("hidden_size");
  s.layers = k.integer("num_hidden_layers");
  s.heads = k.integer("num_attention_heads");
  s.kv_heads = k.integer("num_key_value_heads");
  s.ffn_hidden = k.integer("intermediate_size");
  s.vocab = k.integer("vocab_size");
  s.seq_len = k.integer("max_position_embeddings");
  s.norm_eps = k.number("rms_norm_eps");
  if (explicit_head_dim)
    s.head_dim = k.integer("head_dim", head_dim_required ? -1 : 0);
  if (!latent && s.head_dim == 0 && s.hidden % s.heads != 0)
    k.refuse("num_attention_heads",
             fmt::format("{} does not divide hidden_size {} (and no head_dim says the heads' "
                         "width)",
                         s.heads, s.hidden));
  if (s.head_dim * s.heads == s.hidden)
    s.head_dim = 0; // the default width: the same model, written as the tiny llama is
  if (s.heads % s.kv_heads != 0)
    k.refuse("num_key_value_heads",
             fmt::format("{} does not divide num_attention_heads {}", s.kv_heads, s.heads));
  const std::string act = k.text("hidden_act", "silu");
  if (act != "silu")
    k.refuse("hidden_act",
             fmt::format("is \"{}\"; meshsim's feed-forward is SwiGLU (silu)", printable(act)));
  s.tie_head = k.boolean("tie_word_embeddings", false);
  k.require_zero("attention_dropout",
                 "meshsim's dropout is --dropout, not a part of the model's shape");
  read_rope(k, s);
}

// A sliding window of attention: off, or the key refused.
void refuse_sliding_window(Keys& k, bool has_switch) {
  const std::string why = "meshsim's attention sees every earlier token (no sliding window)";
  if (has_switch) {
    k.require_bool("use_sliding_window", false, false, why);
    k.find("sliding_window"); // read only with use_sliding_window
    k.find("max_window_layers");
  } else {
    k.require_null("sliding_window", why);
  }
}

// The first layers dense by mlp_only_layers = [0, 1, ..., k-1], every other a mixture of
// experts (decoder_sparse_step 1): what --moe-dense-layers expresses.
int64_t dense_prefix(Keys& k, int64_t layers) {
  if (k.integer("decoder_sparse_step", 1) != 1)
    k.refuse("decoder_sparse_step", fmt::format("is {}; meshsim's mixtures of experts run in "
                                                "every layer after the first dense ones (1)",
                                                k.shown("decoder_sparse_step")));
  const json* only = k.find("mlp_only_layers");
  if (!only)
    return 0;
  if (!only->is_array())
    k.refuse("mlp_only_layers", fmt::format("is {}, not a list", k.shown("mlp_only_layers")));
  for (size_t i = 0; i < only->size(); ++i) {
    const json& v = (*only)[i];
    if (!v.is_number_integer() || v.get<int64_t>() != static_cast<int64_t>(i) ||
        static_cast<int64_t>(i) >= layers)
      k.refuse("mlp_only_layers",
               "is not the first layers in order (0, 1, ...): meshsim keeps only a first run of "
               "layers dense (--moe-dense-layers)");
  }
  return static_cast<int64_t>(only->size());
}

// The routed experts (`experts_key`), the top k, and the balancing loss's coefficient
// (`aux_key`, absent: meshsim's default); the router is softmax unless the caller says otherwise.
void read_router(Keys& k, MoeShape& m, const std::string& experts_key,
                 const std::string& aux_key = "router_aux_loss_coef") {
  m.experts = k.integer(experts_key);
  m.top_k = k.integer("num_experts_per_tok");
  if (m.top_k > m.experts)
    k.refuse("num_experts_per_tok",
             fmt::format("{} is more than the {} experts ({})", m.top_k, m.experts, experts_key));
  m.router = "softmax";
  if (const json* v = k.find(aux_key)) {
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0)
      k.refuse(aux_key, fmt::format("is {}; meshsim needs a number from 0", k.shown(aux_key)));
    m.aux_loss = v->get<double>();
  }
}

// One reader per model_type.
void read_llama(Keys& k, TransformerShape& s) {
  read_common(k, s, true, false);
  s.qkv_bias = s.out_bias = k.boolean("attention_bias", false);
  k.require_bool("mlp_bias", false, false, "meshsim's SwiGLU has no biases");
  if (k.integer("pretraining_tp", 1) != 1)
    k.refuse("pretraining_tp", "is not 1; meshsim computes the projections whole");
}

void read_mistral(Keys& k, TransformerShape& s) {
  read_common(k, s, true, false);
  // MistralConfig's default window is 4096: an absent key turns it on.
  k.require_null("sliding_window", "meshsim's attention sees every earlier token", false);
}

void read_qwen2(Keys& k, TransformerShape& s) {
  read_common(k, s, false, false);
  s.qkv_bias = true; // Qwen2's q, k and v always have biases; its o has none
  refuse_sliding_window(k, true);
}

void read_qwen3(Keys& k, TransformerShape& s) {
  read_common(k, s, true, true);
  s.qkv_bias = s.out_bias = k.boolean("attention_bias", false);
  s.qk_norm = true;
  refuse_sliding_window(k, true);
}

void read_mixtral(Keys& k, TransformerShape& s) {
  read_common(k, s, true, false);
  k.require_null("sliding_window", "meshsim's attention sees every earlier token");
  read_router(k, s.moe, "num_local_experts");
  s.moe.ffn = s.ffn_hidden; // intermediate_size is each expert's width
  s.moe.normalize = true;   // the top k of the softmax, renormalised
  k.require_zero("router_jitter_noise", "meshsim's router adds no noise");
}

void read_qwen3_moe(Keys& k, TransformerShape& s) {
  read_qwen3(k, s);
  read_router(k, s.moe, "num_experts");
  s.moe.ffn = k.integer("moe_intermediate_size");
  s.moe.normalize = k.boolean("norm_topk_prob", false);
  s.moe.dense_layers = dense_prefix(k, s.layers);
  if (s.moe.dense_layers >= s.layers)
    k.refuse("mlp_only_layers", "makes every layer dense; meshsim builds that as model_type qwen3");
}

// DeepSeek-V3: multi-head latent attention, YaRN, dense first layers, then a sigmoid router with
// its steering bias over groups of experts and one shared expert. Its multi-token prediction
// module (num_nextn_predict_layers) is not built, as transformers' DeepseekV3ForCausalLM does
// not build it: the parameters are the main model's.
void read_deepseek_v3(Keys& k, TransformerShape& s) {
  read_common(k, s, false, false, true);
  if (s.kv_heads != s.heads)
    k.refuse("num_key_value_heads",
             fmt::format("is {}; multi-head latent attention gives every one of the {} heads its "
                         "own key and value (num_attention_heads)",
                         s.kv_heads, s.heads));
  s.kv_heads = 0;
  k.require_bool("attention_bias", false, false,
                 "meshsim's latent attention projections have no biases");
  if (k.integer("pretraining_tp", 1) != 1)
    k.refuse("pretraining_tp", "is not 1; meshsim computes the projections whole");
  LatentShape& l = s.latent;
  l.q_rank = k.integer("q_lora_rank", 0, 1);
  l.kv_rank = k.integer("kv_lora_rank");
  l.nope_dim = k.integer("qk_nope_head_dim", -1, 0);
  l.rope_dim = k.integer("qk_rope_head_dim");
  l.v_dim = k.integer("v_head_dim");
  l.interleave = k.boolean("rope_interleave", true);
  if (l.rope_dim % 2 != 0)
    k.refuse("qk_rope_head_dim", fmt::format("is {}; rotary embeddings rotate pairs", l.rope_dim));
  k.integer("num_nextn_predict_layers", 0, 0); // read: the module is not built (above)
  k.integer("ep_size", 1);                     // an inference server's split, not the model's
  MoeShape& m = s.moe;
  read_router(k, m, "n_routed_experts", "aux_loss_alpha");
  m.ffn = k.integer("moe_intermediate_size");
  m.shared_ffn = k.integer("n_shared_experts", 0, 0) * m.ffn;
  m.dense_layers = k.integer("first_k_dense_replace", 0, 0);
  if (m.dense_layers >= s.layers)
    k.refuse("first_k_dense_replace",
             fmt::format("{} makes every one of the {} layers dense", m.dense_layers, s.layers));
  if (k.integer("moe_layer_freq", 1) != 1)
    k.refuse("moe_layer_freq", "is not 1; meshsim's mixtures of experts run in every layer after "
                               "the first dense ones");
  const std::string scoring = k.text("scoring_func", "sigmoid");
  if (scoring != "sigmoid")
    k.refuse("scoring_func", fmt::format("is \"{}\"; DeepSeek-V3's router is sigmoid",
                                         printable(scoring)));
  const std::string method = k.text("topk_method", "noaux_tc");
  if (method != "noaux_tc")
    k.refuse("topk_method",
             fmt::format("is \"{}\"; meshsim's sigmoid router chooses as noaux_tc does (scores "
                         "plus a steering bias, within the best groups)",
                         printable(method)));
  m.router = "sigmoid";
  m.groups = k.integer("n_group", 1);
  m.top_groups = k.integer("topk_group", 1);
  if (m.experts % m.groups != 0)
    k.refuse("n_group", fmt::format("{} does not divide the {} experts", m.groups, m.experts));
  if (m.top_groups > m.groups)
    k.refuse("topk_group", fmt::format("{} is more than n_group {}", m.top_groups, m.groups));
  if (m.top_k > m.top_groups * (m.experts / m.groups))
    k.refuse("num_experts_per_tok",
             fmt::format("{} is more than the {} experts of topk_group {} groups", m.top_k,
                         m.top_groups * (m.experts / m.groups), m.top_groups));
  m.normalize = k.boolean("norm_topk_prob", true);
  m.routed_scale = k.number("routed_scaling_factor", 1.0);
  k.require_bool("seq_aux", true, true,
                 "meshsim's balancing loss is taken per sequence (DeepSeek-V3's seq_aux)");
}

struct ModelType {
  const char* name;
  void (*read)(Keys&, TransformerShape&);
};

const ModelType kModelTypes[] = {{"llama", read_llama},     {"mistral", read_mistral},
                                 {"qwen2", read_qwen2},     {"qwen3", read_qwen3},
                                 {"mixtral", read_mixtral}, {"qwen3_moe", read_qwen3_moe},
                                 {"deepseek_v3", read_deepseek_v3}};

} // namespace

HfModel parse_hf_config(const json& doc, const std::string& where) {
  if (!doc.is_object())
    throw std::invalid_argument(fmt::format("{} is {}, not a JSON object", where, doc.type_name()));
  Keys k(doc, where);
  HfModel out;
  out.model_type = k.text("model_type", "");
  const ModelType* type = nullptr;
  for (const ModelType& t : kModelTypes)
    if (out.model_type == t.name)
      type = &t;
  if (!type)
    k.refuse("model_type", fmt::format("is \"{}\"; meshsim reads llama, mistral, qwen2, qwen3, "
                                       "mixtral, qwen3_moe and deepseek_v3",
                                       printable(out.model_type)));
  out.family = "llama";
  type->read(k, out.shape);
  k.refuse_unread("model_type " + out.model_type);
  return out;
}

HfModel read_hf_config(const std::string& path) {
  const bool folder = path_kind(path) == PathKind::kFolder;
  const std::string file = folder ? (std::filesystem::path(path) / "config.json").string() : path;
  const std::string where = printable(file);
  return parse_hf_config(parse_json(read_input_file(file, "--hf-config", kMaxConfigBytes), where),
                         where);
}

} // namespace meshsim
