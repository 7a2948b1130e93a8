// The model's shape on the command line (declared in config/config.h): a preset (models/presets.h)
// applied under the flags given, and the checks every transformer shape must pass, whatever the
// family.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/printable.h"
#include "config/config.h"
#include "models/family.h"
#include "models/hf_config.h"
#include "models/presets.h"

namespace meshsim {
namespace {

// Levenshtein distance: how many one-character edits turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

// Each shape flag and how it copies its field from a preset.
struct ShapeField {
  std::string flag;
  void (*copy)(TransformerShape& to, const TransformerShape& from);
};

const std::vector<ShapeField>& shape_fields() {
  static const std::vector<ShapeField> fields = {
      {"--layers", [](TransformerShape& t, const TransformerShape& f) { t.layers = f.layers; }},
      {"--hidden", [](TransformerShape& t, const TransformerShape& f) { t.hidden = f.hidden; }},
      {"--heads", [](TransformerShape& t, const TransformerShape& f) { t.heads = f.heads; }},
      {"--kv-heads", [](TransformerShape& t, const TransformerShape& f) { t.kv_heads = f.kv_heads; }},
      {"--ffn-hidden", [](TransformerShape& t, const TransformerShape& f) { t.ffn_hidden = f.ffn_hidden; }},
      {"--seq-len", [](TransformerShape& t, const TransformerShape& f) { t.seq_len = f.seq_len; }},
      {"--vocab", [](TransformerShape& t, const TransformerShape& f) { t.vocab = f.vocab; }},
      {"--tie-head", [](TransformerShape& t, const TransformerShape& f) { t.tie_head = f.tie_head; }},
      {"--rope-theta", [](TransformerShape& t, const TransformerShape& f) { t.rope_theta = f.rope_theta; }},
      {"--moe-experts", [](TransformerShape& t, const TransformerShape& f) { t.moe.experts = f.moe.experts; }},
      {"--moe-top-k", [](TransformerShape& t, const TransformerShape& f) { t.moe.top_k = f.moe.top_k; }},
      {"--moe-ffn", [](TransformerShape& t, const TransformerShape& f) { t.moe.ffn = f.moe.ffn; }},
      {"--moe-shared-ffn", [](TransformerShape& t, const TransformerShape& f) { t.moe.shared_ffn = f.moe.shared_ffn; }},
      {"--moe-dense-layers", [](TransformerShape& t, const TransformerShape& f) { t.moe.dense_layers = f.moe.dense_layers; }},
      // The router's kind with how it weighs and groups its choice.
      {"--moe-router", [](TransformerShape& t, const TransformerShape& f) {
         t.moe.router = f.moe.router, t.moe.normalize = f.moe.normalize;
         t.moe.routed_scale = f.moe.routed_scale;
         t.moe.groups = f.moe.groups, t.moe.top_groups = f.moe.top_groups;
       }},
      {"--moe-aux-loss", [](TransformerShape& t, const TransformerShape& f) { t.moe.aux_loss = f.moe.aux_loss; }},
      {"--moe-capacity-factor", [](TransformerShape& t, const TransformerShape& f) { t.moe.capacity_factor = f.moe.capacity_factor; }},
  };
  return fields;
}

// The shape of a preset or config.json over `to`: the fields no flag sets always, the others
// unless their flag was given.
void copy_shape(TransformerShape& to, const TransformerShape& from, const ModelFlagsGiven& given) {
  to.head_dim = from.head_dim;
  to.qkv_bias = from.qkv_bias;
  to.out_bias = from.out_bias;
  to.qk_norm = from.qk_norm;
  to.norm_eps = from.norm_eps;
  to.rope_scaling = from.rope_scaling;
  to.latent = from.latent;
  for (const ShapeField& f : shape_fields())
    if (std::find(given.shape.begin(), given.shape.end(), f.flag) == given.shape.end())
      f.copy(to, from);
}

} // namespace

// The three preset names nearest to `name`, for a message that helps with a typo.
std::string nearest_preset_names(const std::string& name) {
  std::vector<std::pair<size_t, std::string>> by_distance;
  for (const ModelPreset& p : model_presets())
    by_distance.emplace_back(edit_distance(name, p.name), p.name);
  std::stable_sort(by_distance.begin(), by_distance.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(3, by_distance.size()); ++i)
    out += (i ? ", " : "") + by_distance[i].second;
  return out;
}

std::string unknown_preset_message(const std::string& name) {
  return fmt::format("unknown preset '{}' (nearest: {}; `meshsim models` lists them all)", name,
                     nearest_preset_names(name));
}

const std::vector<std::string>& shape_flag_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ShapeField& f : shape_fields())
      out.push_back(f.flag);
    return out;
  }();
  return names;
}

void apply_preset(TrainConfig& c, const ModelFlagsGiven& given) {
  const bool model_is_preset = given.model && find_preset(c.model) != nullptr;
  if (model_is_preset) {
    require(!given.preset || c.preset == c.model,
            fmt::format("--model {} and --preset {} name two different presets; give one", c.model,
                        c.preset));
    c.preset = c.model;
  }
  if (!given.preset && !model_is_preset) {
    // A preset from --config labels the file's shape; --model of another family leaves that
    // shape behind, and the label with it.
    const ModelPreset* label = find_preset(c.preset);
    if (given.model && label && label->family != c.model)
      c.preset.clear();
    // The tiny llama groups its queries, as every published llama past 7B does: two query
    // heads per kv head, unless --kv-heads says otherwise.
    const bool kv_given =
        std::find(given.shape.begin(), given.shape.end(), "--kv-heads") != given.shape.end();
    const ModelFamily* family = find_model_family(c.model);
    if (family && family->grouped_query && !label && !kv_given && c.shape.kv_heads == 0 &&
        c.shape.heads % 2 == 0)
      c.shape.kv_heads = c.shape.heads / 2;
    return;
  }
  const ModelPreset* p = find_preset(c.preset);
  require(p != nullptr, unknown_preset_message(c.preset));
  require(!given.model || model_is_preset || c.model == p->family,
          fmt::format("--preset {} is a {} model, not --model {}", p->name, p->family, c.model));
  c.model = p->family;
  c.hf_config.clear(); // the shape is the preset's now, not a file's
  copy_shape(c.shape, p->shape, given);
}

void apply_hf_config(TrainConfig& c, const ModelFlagsGiven& given) {
  require(
      !given.preset && !(given.model && find_preset(c.model)),
      "--hf-config and --preset (or a preset as --model) both name the model's shape: give one");
  const HfModel m = read_hf_config(c.hf_config);
  require(!given.model || c.model == m.family,
          fmt::format("--hf-config {} describes a {} model ({}), not --model {}",
                      printable(c.hf_config), m.family, m.model_type, c.model));
  c.model = m.family;
  c.preset.clear();
  copy_shape(c.shape, m.shape, given);
}

namespace {

// The mixture-of-experts part of a shape (models/layers/moe.h).
void validate_moe(const std::string& family, const TransformerShape& g) {
  const MoeShape& m = g.moe;
  if (m.experts == 0) {
    const MoeShape dense;
    const bool any = m.top_k != dense.top_k || m.ffn != dense.ffn ||
                     m.shared_ffn != dense.shared_ffn || m.dense_layers != dense.dense_layers ||
                     m.router != dense.router || m.normalize != dense.normalize ||
                     m.routed_scale != dense.routed_scale || m.groups != dense.groups ||
                     m.top_groups != dense.top_groups || m.aux_loss != dense.aux_loss ||
                     m.capacity_factor != dense.capacity_factor;
    require(!any, "the --moe-* flags shape a mixture of experts: give --moe-experts too");
    return;
  }
  require(family == "llama",
          fmt::format("--moe-experts applies to --model llama, not {}", family));
  require(m.experts >= 1, fmt::format("--moe-experts must be positive, got {}", m.experts));
  require(m.top_k >= 1 && m.top_k <= m.experts,
          fmt::format("--moe-top-k {} must be between 1 and --moe-experts {}", m.top_k, m.experts));
  require(m.ffn >= 0 && m.shared_ffn >= 0,
          fmt::format("--moe-ffn and --moe-shared-ffn must be positive, got {} and {}", m.ffn,
                      m.shared_ffn));
  require(m.dense_layers >= 0 && m.dense_layers < g.layers,
          fmt::format("--moe-dense-layers {} leaves none of the {} layers a mixture of experts",
                      m.dense_layers, g.layers));
  require(m.router == "softmax" || m.router == "sigmoid",
          fmt::format("unknown --moe-router '{}' (choose softmax or sigmoid)", m.router));
  require(m.groups >= 1 && m.top_groups >= 1 && m.top_groups <= m.groups &&
              m.experts % m.groups == 0 && (m.groups == 1 || m.router == "sigmoid"),
          fmt::format("{} experts in {} groups keeping {}: the groups must divide the experts "
                      "and group-limited routing is the sigmoid router's",
                      m.experts, m.groups, m.top_groups));
  require(std::isfinite(m.aux_loss) && m.aux_loss >= 0,
          fmt::format("--moe-aux-loss must be at least 0, got {}", m.aux_loss));
  require(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0,
          fmt::format("--moe-capacity-factor must be at least 0 (0: dropless), got {}",
                      m.capacity_factor));
  require(std::isfinite(m.routed_scale) && m.routed_scale > 0,
          fmt::format("the routed scale must be positive, got {}", m.routed_scale));
}

} // namespace

void validate_shape(const std::string& family, const TransformerShape& g) {
  const std::pair<const char*, int64_t> positive[] = {{"--layers", g.layers},
                                                      {"--hidden", g.hidden},
                                                      {"--heads", g.heads},
                                                      {"--seq-len", g.seq_len},
                                                      {"--vocab", g.vocab}};
  for (const auto& [flag, value] : positive)
    require(value >= 1, fmt::format("{} must be positive, got {}", flag, value));
  // 0 is the family's default (a flag refuses 0 on its text; config.json may hold it).
  require(g.kv_heads >= 0, fmt::format("--kv-heads must be positive, got {}", g.kv_heads));
  require(g.ffn_hidden >= 0, fmt::format("--ffn-hidden must be positive, got {}", g.ffn_hidden));
  require(g.head_dim > 0 || g.hidden % g.heads == 0,
          fmt::format("--hidden {} is not divisible by --heads {}", g.hidden, g.heads));
  require(
      g.head_dim >= 0 && g.head_dim % 2 == 0,
      fmt::format("head_dim must be positive and even (rotary rotates pairs), got {}", g.head_dim));
  require(std::isfinite(g.norm_eps) && g.norm_eps > 0,
          fmt::format("norm_eps must be a positive number, got {}", g.norm_eps));
  const bool llama_only = g.head_dim > 0 || g.qkv_bias || g.out_bias || g.qk_norm ||
                          g.norm_eps != TransformerShape{}.norm_eps || g.rope_scaling.factor > 0 ||
                          g.latent.kv_rank > 0;
  require(!llama_only || model_family(family).rotary,
          fmt::format("head_dim, attention biases, q/k norms, norm_eps, rope scaling and latent "
                      "attention are the llama's (from --hf-config), not {}'s",
                      family));
  const RopeScaling& r = g.rope_scaling;
  require(r.factor == 0 ||
              (std::isfinite(r.factor) && r.factor > 0 && std::isfinite(r.low_freq_factor) &&
               r.low_freq_factor > 0 && std::isfinite(r.high_freq_factor) &&
               r.high_freq_factor > r.low_freq_factor && r.original_max >= 1),
          "rope_scaling needs a positive factor, 0 < low_freq_factor < high_freq_factor and a "
          "positive original_max");
  require(!r.yarn || (r.factor > 0 && std::isfinite(r.beta_fast) && std::isfinite(r.beta_slow) &&
                      r.beta_slow > 0 && r.beta_fast > r.beta_slow && std::isfinite(r.mscale) &&
                      r.mscale >= 0 && std::isfinite(r.mscale_all_dim) && r.mscale_all_dim >= 0),
          "yarn rope scaling needs a positive factor, 0 < beta_slow < beta_fast and mscale, "
          "mscale_all_dim of 0 or more");
  const LatentShape& l = g.latent;
  if (l.kv_rank != 0) {
    require(l.kv_rank > 0 && l.q_rank >= 0 && l.nope_dim >= 0 && l.rope_dim >= 2 &&
                l.rope_dim % 2 == 0 && l.v_dim >= 1,
            fmt::format("latent attention needs kv_rank, v_dim and an even rope_dim positive, "
                        "q_rank and nope_dim positive or 0; got kv_rank {}, q_rank {}, nope {}, "
                        "rope {}, v {}",
                        l.kv_rank, l.q_rank, l.nope_dim, l.rope_dim, l.v_dim));
    const int64_t limit = int64_t{1} << 20;
    require(l.kv_rank <= limit && l.q_rank <= limit && l.nope_dim <= limit &&
                l.rope_dim <= limit && l.v_dim <= limit,
            "latent attention's ranks and widths must be at most 2^20");
    require(g.head_dim == 0 && !g.qkv_bias && !g.qk_norm &&
                (g.kv_heads == 0 || g.kv_heads == g.heads),
            "latent attention sets its own head widths: it takes no head_dim, q/k/v biases, "
            "q/k norms or fewer kv heads");
  }
  if (!model_family(family).grouped_query)
    require(
        g.kv_heads == 0 || g.kv_heads == g.heads,
        fmt::format("--kv-heads {}: gpt has one key/value head per query head ({}); grouped-query "
                    "attention is llama's",
                    g.kv_heads, g.heads));
  require(g.heads % preset_kv_heads(g) == 0,
          fmt::format("--heads {} is not divisible by --kv-heads {}", g.heads, g.kv_heads));
  require(std::isfinite(g.rope_theta) && g.rope_theta > 0,
          fmt::format("--rope-theta must be a positive finite number, got {}", g.rope_theta));
  validate_moe(family, g);
  // An upper bound of either family's count (per layer at most 4H² for attention, 3HF for the
  // MLP, or an MoE layer's router and experts, 13H for biases and norms; two V×H matrices and
  // the S×H positions), in floating point so that no int64 overflows before the limit is
  // checked.
  const double h = static_cast<double>(g.hidden);
  const double ffn = g.ffn_hidden > 0 ? static_cast<double>(g.ffn_hidden) : 4 * h;
  const MoeShape& m = g.moe;
  const double experts_ffn =
      m.experts > 0 ? static_cast<double>(m.experts) * (m.ffn > 0 ? static_cast<double>(m.ffn) : ffn) +
                          static_cast<double>(m.shared_ffn) + static_cast<double>(m.experts) / 3
                    : 0;
  // Latent attention: its five projections, each bounded by its two widths' product.
  const double heads = static_cast<double>(g.heads);
  const double latent =
      l.kv_rank > 0
          ? (h + heads * static_cast<double>(l.nope_dim + l.rope_dim)) *
                    static_cast<double>(std::max<int64_t>(l.q_rank, 1) + l.kv_rank + l.rope_dim) +
                heads * static_cast<double>(l.nope_dim + l.v_dim) * static_cast<double>(l.kv_rank) +
                heads * static_cast<double>(l.v_dim + l.nope_dim + l.rope_dim) * h
          : 0;
  const double bound =
      static_cast<double>(g.layers) *
          (latent +
           4 * h * std::max(h, static_cast<double>(g.heads) * static_cast<double>(g.head_dim)) +
           3 * h * std::max(ffn, experts_ffn) + 13 * h +
           4 * static_cast<double>(g.heads) * static_cast<double>(g.head_dim)) +
      (2 * static_cast<double>(g.vocab) + static_cast<double>(g.seq_len) + 2) * h;
  require(bound <= kMaxParameters,
          fmt::format("the model is too large: --layers {}, --hidden {}, --ffn-hidden {:.0f}, "
                      "--vocab {} and --seq-len {} make up to {:.3g} parameters, over meshsim's "
                      "limit of {:.0e}",
                      g.layers, g.hidden, ffn, g.vocab, g.seq_len, bound, kMaxParameters));
}

} // namespace meshsim
