// validate's rules for the model (config.cpp): its name and preset, its data, its shape
// against the layout, and its activations against what a tensor can address. What differs by
// model is read from its family (models/family.h).
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include "config/config.h"
#include "config/stage_layers.h"
#include "config/validation_steps.h"
#include "models/family.h"
#include "models/presets.h"
#include "parallel/pipeline/pipeline.h"

namespace meshsim {

void check_model_name(const TrainConfig& c) {
  if (find_model_family(c.model) == nullptr) {
    std::string names;
    for (const std::string& n : model_names())
      names += n + ", ";
    throw std::invalid_argument(fmt::format(
        "unknown model '{}' (choose {}or a preset: nearest {}; `meshsim models` lists them)",
        c.model, names, nearest_preset_names(c.model)));
  }
  if (!c.preset.empty()) {
    const ModelPreset* p = find_preset(c.preset);
    require(p != nullptr, unknown_preset_message(c.preset));
    require(p->family == c.model,
            fmt::format("preset {} is a {} model, not {}", p->name, p->family, c.model));
  }
}

void resolve_model_data(TrainConfig& c) {
  const ModelFamily& family = model_family(c.model);
  if (c.data.empty())
    c.data = family.default_data;
  require(*family.synthetic_only == '\0' || c.data == "synthetic",
          fmt::format("--model {} reads {}: only --data synthetic makes them, not '{}'",
                      c.model, family.synthetic_only, c.data));
}

void validate_model_layout(const TrainConfig& c) {
  const ModelFamily& family = model_family(c.model);
  require(c.attention == "fused" || c.attention == "eager",
          fmt::format("unknown --attention '{}' (choose fused or eager)", c.attention));
  require(c.elementwise == "fused" || c.elementwise == "eager",
          fmt::format("unknown --elementwise '{}' (choose fused or eager)", c.elementwise));
  // fused is the default, whatever the model; only a transformer has a core to choose.
  require(family.transformer || c.attention == "fused",
          fmt::format("--attention applies to the attention of --model gpt and llama, not {}",
                      c.model));
  stage_layer_counts(c); // unequal stages: refused in one line unless they can be
  require(c.ep == 1 || (family.transformer && c.shape.moe.experts > 0),
          fmt::format("--ep {} splits a mixture of experts over ranks: it needs --moe-experts",
                      c.ep));
  if (family.transformer) {
    const auto& g = c.shape;
    validate_shape(c.model, g);
    // A mixture of experts (models/layers/moe.h) splits over ep (parallel/expert/).
    require(g.moe.experts == 0 || g.moe.experts % c.ep == 0,
            fmt::format("--moe-experts {} is not divisible by --ep {}", g.moe.experts, c.ep));
    require(g.moe.experts == 0 || (!c.sequence_parallel && c.strategy != "dp"),
            "--moe-experts does not take --sequence-parallel or --strategy dp yet: its layers "
            "route whole sequences on every rank");
    // Qwen3's q_norm and k_norm: one weight every head shares, whose gradient each tp member
    // would hold only its heads' part of.
    require(!g.qk_norm || c.tp == 1,
            fmt::format("the q/k norms of this model (qk_norm, from --hf-config) do not split over "
                        "--tp {} yet: each member would see its own heads' gradient of the shared "
                        "weight; use --tp 1",
                        c.tp));
    // Multi-head latent attention: every head reads one rotated key part, and its keys and
    // values differ in width.
    require(g.latent.kv_rank == 0 || !c.sequence_parallel,
            "multi-head latent attention (from --hf-config) does not take --sequence-parallel "
            "yet: its down-projections q_a and kv_a are whole on every tp member");
    require(g.latent.kv_rank == 0 || c.cp == 1,
            fmt::format("multi-head latent attention (from --hf-config) does not run with --cp {} "
                        "yet: the context-parallel cores exchange keys and values of one width; "
                        "use --cp 1",
                        c.cp));
    require(g.heads % c.tp == 0,
            fmt::format("--heads {} is not divisible by --tp {}", g.heads, c.tp));
    require(preset_kv_heads(g) % c.tp == 0,
            fmt::format("--kv-heads {} is not divisible by --tp {}", preset_kv_heads(g), c.tp));
    require(!c.sequence_parallel || g.seq_len % c.tp == 0,
            fmt::format("--seq-len {} is not divisible by --tp {} (--sequence-parallel splits the "
                        "sequence over the tp group)",
                        g.seq_len, c.tp));
    // Context parallelism: 2·cp chunks, each cut again over tp under sequence parallelism.
    const int64_t cp_parts = int64_t{2} * c.cp * (c.sequence_parallel ? c.tp : 1);
    require(c.cp == 1 || g.seq_len % cp_parts == 0,
            fmt::format("--seq-len {} is not divisible by 2 × --cp {}{} = {}", g.seq_len, c.cp,
                        c.sequence_parallel ? fmt::format(" × --tp {}", c.tp) : "", cp_parts));
    require(g.layers >= c.pp,
            fmt::format("--layers {} is fewer than --pp {}: every stage needs a layer", g.layers, c.pp));
    require(g.layers / c.pp >= c.virtual_stages,
            fmt::format("--layers {} is fewer than --pp {} × --virtual-stages {} = {}: every model "
                        "chunk needs a layer",
                        g.layers, c.pp, c.virtual_stages,
                        static_cast<int64_t>(c.pp) * c.virtual_stages));
    // With a pipeline the last stage holds a copy of the embedding whose gradient the
    // embedding group sums after the dp reduction: on whole gradients (ZeRO 0 and 1).
    require(!g.tie_head || c.pp == 1 || c.zero <= 1,
            fmt::format("--tie-head with --pp {} runs with --zero 0 or 1, not {}: the embedding "
                        "group sums whole gradients; use --no-tie-head",
                        c.pp, c.zero));
    require(c.data == "synthetic" || g.vocab >= 256,
            fmt::format("--vocab {} is too small for byte-level text (256 byte values)", g.vocab));
  } else {
    require(c.init_from.empty(),
            fmt::format("--init-from reads the Hugging Face folders of gpt and llama; {} has none",
                        c.model));
    require(c.tp == 1, "--tp needs --model gpt: its plan splits attention and the MLP");
    require(c.cp == 1, "--cp needs a transformer (gpt, llama): it splits the sequence");
    require(c.recompute == "none", "--recompute applies to the transformer blocks of --model gpt");
    require(c.dropout == 0, "--dropout applies to the transformer blocks of --model gpt and llama");
    ModelOptions shapes; // the layers' count only: on meta where the model can be
    if (family.builds_on_meta)
      shapes.device = torch::kMeta;
    const int units = pipeline_units(build_model(c.model, shapes));
    require(c.pp <= units, fmt::format("--pp {} is more than {}'s {} layers with parameters", c.pp,
                                       c.model, units));
    require(units / c.pp >= c.virtual_stages,
            fmt::format("--pp {} × --virtual-stages {} = {} is more than {}'s {} layers with "
                        "parameters: every model chunk needs one",
                        c.pp, c.virtual_stages, static_cast<int64_t>(c.pp) * c.virtual_stages,
                        c.model, units));
  }
}

// LibTorch computes a tensor's bytes in int64 ("Storage size calculation overflowed"): the
// largest activations of one micro-batch, eager attention's scores [b, heads, s, s] and the
// logits [b, s, vocab], must stay far inside it. In floating point, so nothing overflows first.
void check_activation_sizes(const TrainConfig& c) {
  if (!model_family(c.model).transformer)
    return; // an image model's activations are fixed and small
  const TransformerShape& g = c.shape;
  const double b = static_cast<double>(c.batch_size / c.micro_batches);
  const double s = static_cast<double>(g.seq_len);
  const double scores = b * static_cast<double>(g.heads) * s * s;
  require(scores <= kMaxTensorNumbers,
          fmt::format("--seq-len {}: one micro-batch's attention scores [{:.0f}, {}, {}, {}] would "
                      "hold {:.3g} numbers, more than a tensor can address ({:.3g})",
                      g.seq_len, b, g.heads, g.seq_len, g.seq_len, scores, kMaxTensorNumbers));
  const double logits = b * s * static_cast<double>(g.vocab);
  require(logits <= kMaxTensorNumbers,
          fmt::format("--seq-len {} with --vocab {}: one micro-batch's logits [{:.0f}, {}, {}] "
                      "would hold {:.3g} numbers, more than a tensor can address ({:.3g})",
                      g.seq_len, g.vocab, b, g.seq_len, g.vocab, logits, kMaxTensorNumbers));
}

} // namespace meshsim
