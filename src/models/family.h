// The table of model families: everything meshsim knows about a --model name, one row each
// (how to build it, its parameter count, the identity its checkpoints record, its data, its
// example batch for plans, its parallel plan). Code elsewhere reads a row's fields and
// never compares a model's name, so a new model is one more row.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "data/dataset.h"
#include "models/models.h"
#include "models/parallel_plan.h"

namespace meshsim {

/// The default data: Fashion-MNIST's IDX files (the image nets), and text every Debian machine
/// has (package base-files) for the transformers.
constexpr const char* kDefaultData = "/usr/share/datasets/fashion-mnist";
constexpr const char* kDefaultText = "/usr/share/common-licenses/GPL-3";

/// What one sample of the family is: tokens (TransformerShape::seq_len of them), a 1×28×28
/// image (Fashion-MNIST's), or a 3×224×224 image (ImageNet's).
enum class SampleKind { Tokens, SmallImage, LargeImage };

/// Where a run's data comes from: --data (a path or "synthetic"), the synthetic sizes, and the
/// shape (tokens per sample, vocabulary) a transformer's data needs.
struct DataRequest {
  std::string data;
  int64_t synthetic_train = 0, synthetic_test = 0;
  TransformerShape shape;
  uint64_t seed = 0;
};

struct ModelFamily {
  std::string name; ///< what --model accepts
  /// A decoder-only transformer: reads tokens, is shaped by TransformerShape (and so takes the
  /// shape flags and presets), splits by --tp, and recomputes its blocks.
  bool transformer = false;
  /// Its parameters can be created on the meta device, which `meshsim plan` runs.
  bool builds_on_meta = false;
  /// Grouped-query attention: --kv-heads may be fewer than --heads, and the default shape
  /// groups two query heads per key/value head.
  bool grouped_query = false;
  /// Rotary position embeddings: --rope-theta applies.
  bool rotary = false;
  /// Its PyTorch twin is an nn.Sequential with numbered children, so an export names the
  /// parameters "0.weight", not "conv1.weight".
  bool numbered_children = false;
  SampleKind samples = SampleKind::SmallImage;
  /// The data it trains on when --data is not given.
  const char* default_data = kDefaultData;
  /// Its samples only --data synthetic makes ("3×224×224 images of 1000 classes"); "" when it
  /// reads files too.
  const char* synthetic_only = "";
  /// Its parallel plan (models/parallel_plan.h), declared beside the model: what tensor
  /// parallelism splits, the vocabulary head, where a pipeline may cut, the attention cores.
  /// Null: the family has no plan; --tp refuses it, and a pipeline cuts it at every child
  /// with parameters.
  ParallelPlan (*parallel_plan)(const TransformerShape& shape) = nullptr;
  /// Builds it in PyTorch's layer order, its parameters made with `tensors` (device and dtype);
  /// build_model (models.h) seeds the generator and moves the result.
  torch::nn::Sequential (*build)(const ModelOptions& options,
                                 const torch::TensorOptions& tensors) = nullptr;
  /// Its parameters in closed form for a shape (presets.h); null for the image nets.
  int64_t (*parameter_count)(const TransformerShape& shape) = nullptr;
  /// The parameters one token meets (a mixture of experts' top_k of its routed experts); null:
  /// parameter_count.
  int64_t (*active_parameter_count)(const TransformerShape& shape) = nullptr;
  /// The MLP's inner width for a shape (ffn_hidden, or the family's default); null for the
  /// image nets.
  int64_t (*ffn_hidden)(const TransformerShape& shape) = nullptr;
  /// The model as a checkpoint's manifest records it, exactly as earlier versions wrote it, so
  /// that their checkpoints still resume.
  std::string (*checkpoint_identity)(const TransformerShape& shape) = nullptr;
};

/// Every family, in the order `--model` lists them: cnn, lenet, gpt, llama, resnet50.
const std::vector<ModelFamily>& model_families();

/// The names of model_families(), in order.
const std::vector<std::string>& model_names();

/// The family called `name`, or nullptr.
const ModelFamily* find_model_family(const std::string& name);

/// The family called `name`. Throws std::invalid_argument for an unknown name, listing the
/// known ones.
const ModelFamily& model_family(const std::string& name);

/// A batch of `batch_size` samples as the data loader hands it over, with `options` (their
/// device; images are float32, token ids and labels int64): tokens [B, T] with next-token
/// targets [B, T], or images [B, C, S, S] with labels [B].
std::pair<torch::Tensor, torch::Tensor> example_batch(const ModelFamily& family,
                                                      int64_t batch_size,
                                                      const TransformerShape& shape,
                                                      const torch::TensorOptions& options);

/// Tokens in one sample (an image counts as one).
int64_t tokens_per_sample(const ModelFamily& family, const TransformerShape& shape);

/// Bytes of one synthetic sample as made: images in float32 (and, for 28×28 ones, an int64
/// label); tokens as int64 inputs and labels.
double synthetic_sample_bytes(const ModelFamily& family, const TransformerShape& shape);

/// One sample in words, plural: "3×224×224 images", "sequences of 64 tokens", "28×28 images".
std::string sample_description(const ModelFamily& family, const TransformerShape& shape);

/// The family's data: synthetic, a text file cut into sequences, or Fashion-MNIST's files.
DataSplit make_family_data(const ModelFamily& family, const DataRequest& request);

} // namespace meshsim
