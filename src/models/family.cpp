// The rows of the model-family table (models/family.h), and what follows from a row's kind of
// sample: its example batch, its synthetic bytes, its data.
#include "models/family.h"

#include <stdexcept>

#include <fmt/format.h>

#include "data/text.h"
#include "models/cnn.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "models/resnet.h"

namespace meshsim {
namespace {

// "gpt (2 layers, hidden 64, ...)": the identity checkpoints have recorded since the first
// transformer; `more` adds what later fields changed from their defaults.
std::string transformer_identity(const std::string& name, const TransformerShape& g,
                                 const std::string& more) {
  return fmt::format("{} ({} layers, hidden {}, {} heads, {} tokens, vocabulary {}, {} head{})",
                     name, g.layers, g.hidden, g.heads, g.seq_len, g.vocab,
                     g.tie_head ? "tied" : "untied", more);
}

ModelFamily image_family_of(const std::string& name) {
  ModelFamily f;
  f.name = name;
  return f;
}

ModelFamily cnn_family() {
  ModelFamily f = image_family_of("cnn");
  f.numbered_children = true;
  f.build = [](const ModelOptions&, const torch::TensorOptions&) { return build_cnn(); };
  f.checkpoint_identity = [](const TransformerShape&) { return std::string("cnn"); };
  return f;
}

ModelFamily lenet_family() {
  ModelFamily f = image_family_of("lenet");
  f.build = [](const ModelOptions& o, const torch::TensorOptions&) { return build_lenet(o); };
  f.checkpoint_identity = [](const TransformerShape&) { return std::string("lenet"); };
  return f;
}

ModelFamily resnet50_family() {
  ModelFamily f = image_family_of("resnet50");
  f.builds_on_meta = true;
  f.samples = SampleKind::LargeImage;
  f.default_data = "synthetic";
  f.synthetic_only = "3×224×224 images of 1000 classes";
  f.build = [](const ModelOptions&, const torch::TensorOptions& t) { return build_resnet50(t); };
  f.checkpoint_identity = [](const TransformerShape&) { return std::string("resnet50"); };
  return f;
}

ModelFamily transformer_family_of(const std::string& name) {
  ModelFamily f;
  f.name = name;
  f.transformer = true;
  f.builds_on_meta = true;
  f.samples = SampleKind::Tokens;
  f.default_data = kDefaultText;
  return f;
}

ModelFamily gpt_family() {
  ModelFamily f = transformer_family_of("gpt");
  f.parallel_plan = gpt_parallel_plan;
  f.build = [](const ModelOptions& o, const torch::TensorOptions& t) {
    return build_gpt(o.shape, o.seed, t);
  };
  f.parameter_count = gpt_parameter_count;
  f.ffn_hidden = gpt_ffn_hidden;
  // A gpt of the default MLP width leaves the width out: older manifests' identity.
  f.checkpoint_identity = [](const TransformerShape& g) {
    return transformer_identity("gpt", g,
                                g.ffn_hidden > 0 ? fmt::format(", MLP {}", g.ffn_hidden) : "");
  };
  return f;
}

ModelFamily llama_family() {
  ModelFamily f = transformer_family_of("llama");
  f.grouped_query = true;
  f.rotary = true;
  f.parallel_plan = llama_parallel_plan;
  f.build = [](const ModelOptions& o, const torch::TensorOptions& t) {
    return build_llama(o.shape, o.seed, t);
  };
  f.parameter_count = llama_parameter_count;
  f.active_parameter_count = llama_active_parameter_count;
  f.ffn_hidden = llama_ffn_hidden;
  f.checkpoint_identity = [](const TransformerShape& g) {
    // Latent attention is named only where it is, so earlier identities read the same.
    const LatentShape& l = g.latent;
    const std::string latent =
        l.kv_rank > 0 ? fmt::format(", latent attention q rank {}, kv rank {}, heads {}+{}, "
                                    "values {}",
                                    l.q_rank, l.kv_rank, l.nope_dim, l.rope_dim, l.v_dim)
                      : "";
    return transformer_identity("llama", g,
                                fmt::format(", {} kv heads, MLP {}, rope theta {}{}",
                                            llama_kv_heads(g), llama_ffn_hidden(g), g.rope_theta,
                                            latent));
  };
  return f;
}

} // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families{cnn_family(), lenet_family(), gpt_family(),
                                                 llama_family(), resnet50_family()};
  return families;
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ModelFamily& f : model_families())
      out.push_back(f.name);
    return out;
  }();
  return names;
}

const ModelFamily* find_model_family(const std::string& name) {
  for (const ModelFamily& f : model_families())
    if (f.name == name)
      return &f;
  return nullptr;
}

const ModelFamily& model_family(const std::string& name) {
  if (const ModelFamily* f = find_model_family(name))
    return *f;
  // "choose cnn, lenet, gpt, llama or resnet50"
  const std::vector<std::string>& names = model_names();
  std::string choices;
  for (size_t i = 0; i < names.size(); ++i)
    choices += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw std::invalid_argument("unknown model '" + name + "' (choose " + choices + ")");
}

std::pair<torch::Tensor, torch::Tensor> example_batch(const ModelFamily& family,
                                                      int64_t batch_size,
                                                      const TransformerShape& shape,
                                                      const torch::TensorOptions& options) {
  const auto ids = options.dtype(torch::kLong);
  const auto pixels = options.dtype(torch::kFloat32);
  switch (family.samples) {
  case SampleKind::Tokens:
    return {torch::empty({batch_size, shape.seq_len}, ids),
            torch::empty({batch_size, shape.seq_len}, ids)};
  case SampleKind::LargeImage:
    return {torch::empty({batch_size, kImageChannels, kImageSize, kImageSize}, pixels),
            torch::empty({batch_size}, ids)};
  case SampleKind::SmallImage:
    break;
  }
  return {torch::empty({batch_size, 1, kImageSide, kImageSide}, pixels),
          torch::empty({batch_size}, ids)};
}

int64_t tokens_per_sample(const ModelFamily& family, const TransformerShape& shape) {
  return family.samples == SampleKind::Tokens ? shape.seq_len : 1;
}

double synthetic_sample_bytes(const ModelFamily& family, const TransformerShape& shape) {
  switch (family.samples) {
  case SampleKind::Tokens:
    return 16.0 * static_cast<double>(shape.seq_len);
  case SampleKind::LargeImage:
    return kImageChannels * kImageSize * kImageSize * 4.0;
  case SampleKind::SmallImage:
    break;
  }
  return kImageSide * kImageSide * 4.0 + 8;
}

std::string sample_description(const ModelFamily& family, const TransformerShape& shape) {
  switch (family.samples) {
  case SampleKind::Tokens:
    return fmt::format("sequences of {} tokens", shape.seq_len);
  case SampleKind::LargeImage:
    return "3×224×224 images";
  case SampleKind::SmallImage:
    break;
  }
  return "28×28 images";
}

DataSplit make_family_data(const ModelFamily& family, const DataRequest& r) {
  const bool synthetic = r.data == "synthetic";
  switch (family.samples) {
  case SampleKind::Tokens:
    return synthetic ? synthetic_text(r.synthetic_train, r.synthetic_test, r.shape.seq_len,
                                      r.shape.vocab, r.seed)
                     : make_text_dataset(r.data, r.shape.seq_len);
  case SampleKind::LargeImage:
    return synthetic_images(r.synthetic_train, r.synthetic_test, kImageChannels, kImageSize,
                            kImageClasses, r.seed);
  case SampleKind::SmallImage:
    break;
  }
  return synthetic ? synthetic_dataset(r.synthetic_train, r.synthetic_test, r.seed)
                   : load_idx_dataset(r.data);
}

} // namespace meshsim
