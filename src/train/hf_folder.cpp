// A Hugging Face folder written from a gathered model, and checked and read for --init-from:
// config.json against the run's shape, the safetensors header against the model's tensors,
// then the weights.
#include "train/hf_format.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h> // fmt::join (in fmt/format.h before fmt 11)

#include "base/atomic_file.h"
#include "base/errors.h"
#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"
#include "base/safetensors.h"
#include "memory/allocator.h"
#include "models/family.h"
#include "train/hf_format_families.h"

namespace fs = std::filesystem;

namespace meshsim {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian: tensors are copied to and from it as they lie");

namespace {

// The shape with the family's defaults made explicit, as config.json states them.
TransformerShape hf_resolved_shape(const TrainConfig& config) {
  TransformerShape s = config.shape;
  s.ffn_hidden = model_family(config.model).ffn_hidden(s);
  if (s.kv_heads == 0)
    s.kv_heads = s.heads;
  return s;
}

const HfFamily& hf_family_for(const TrainConfig& config, const std::string& flag) {
  if (const HfFamily* f = find_hf_family(config.model))
    return *f;
  throw std::invalid_argument(fmt::format(
      "{} is for gpt and llama (GPT2LMHeadModel, LlamaForCausalLM); this run's model is {}", flag,
      config.model));
}

struct HfDtypeName {
  torch::Dtype dtype;
  const char* safetensors;
  const char* torch_name;
};
constexpr HfDtypeName kHfFloatDtypes[] = {{torch::kFloat32, "F32", "float32"},
                                          {torch::kBFloat16, "BF16", "bfloat16"},
                                          {torch::kFloat16, "F16", "float16"},
                                          {torch::kFloat64, "F64", "float64"}};

const HfDtypeName* hf_dtype_named(const std::string& safetensors) {
  for (const auto& d : kHfFloatDtypes)
    if (safetensors == d.safetensors)
      return &d;
  return nullptr;
}

const HfDtypeName& hf_dtype_of(const torch::Tensor& t) {
  for (const auto& d : kHfFloatDtypes)
    if (t.scalar_type() == d.dtype)
      return d;
  throw std::invalid_argument(
      fmt::format("a {} parameter has no Hugging Face dtype here", c10::toString(t.scalar_type())));
}

// The run's model on the meta device, its parameters as the file names them: what
// model.safetensors must hold.
NamedTensors hf_expected_tensors(const TrainConfig& config, const HfFamily& family) {
  ModelOptions options;
  options.shape = config.shape;
  options.device = torch::kMeta;
  GpuGuard host(nullptr); // a description, not any GPU's memory
  torch::nn::Sequential model = build_model(config.model, options);
  NamedTensors params;
  std::unordered_set<const void*> seen;
  for (const auto& item : model->named_parameters())
    if (seen.insert(item.value().unsafeGetTensorImpl()).second)
      params.emplace_back(item.key(), item.value());
  return family.to_hf(params, hf_resolved_shape(config));
}

bool hf_name_ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// config.json and the safetensors header, checked; returns the names the file must hold.
NamedTensors check_hf_folder_parts(const TrainConfig& config, const fs::path& dir) {
  const std::string flag = "--init-from " + printable(dir.string());
  const HfFamily& family = hf_family_for(config, "--init-from");
  if (const std::string why = folder_problem(dir.string()); !why.empty())
    throw std::invalid_argument(
        fmt::format("{} is not a Hugging Face model folder: it {}", flag, why));
  const fs::path config_path = dir / "config.json", weights = dir / "model.safetensors";
  if (path_kind(config_path.string()) == PathKind::kNothing)
    throw std::invalid_argument(flag + " has no config.json (a Hugging Face model folder holds "
                                       "config.json and model.safetensors)");
  if (path_kind(weights.string()) == PathKind::kNothing)
    throw std::invalid_argument(
        path_kind((dir / "model.safetensors.index.json").string()) != PathKind::kNothing
            ? flag + " holds a sharded model (model.safetensors.index.json); meshsim reads one "
                     "model.safetensors"
        : fs::is_directory(dir / "checkpoint")
            ? flag + " has no model.safetensors: it is a meshsim run folder; `meshsim export RUN "
                     "--hf DIR` writes its model as one"
            : flag + " has no model.safetensors");
  nlohmann::json doc;
  try {
    doc = parse_json(read_input_file(config_path.string(), "config", kMaxConfigBytes), "");
  } catch (const JsonError& e) {
    throw DataError(fmt::format("{} is damaged{}", printable(config_path.string()), e.what()));
  }
  if (!doc.is_object())
    throw DataError(printable(config_path.string()) + " is not a JSON object");
  const ConfigReader reader(doc, flag + ": config.json's");
  reader.expect_text("model_type", family.model_type, "",
                     fmt::format("this run's --model {} is {}", config.model, family.model_type));
  family.check(reader, hf_resolved_shape(config));

  const SafetensorsHeader header = read_safetensors_header(weights.string());
  const NamedTensors expected = hf_expected_tensors(config, family);
  const std::string file = flag + ": model.safetensors";
  for (const auto& [name, meta] : expected) {
    const std::string& wanted = name; // C++17 lambdas cannot capture a structured binding
    const auto it = std::find_if(header.tensors.begin(), header.tensors.end(),
                                 [&](const SafetensorsInfo& t) { return t.name == wanted; });
    if (it == header.tensors.end())
      throw std::invalid_argument(fmt::format("{} has no tensor {}", file, name));
    if (!hf_dtype_named(it->dtype))
      throw std::invalid_argument(
          fmt::format("{}: tensor {} is {}; meshsim reads weights in F32, BF16, F16 or F64", file,
                      name, it->dtype));
    if (!meta.sizes().equals(it->shape))
      throw std::invalid_argument(fmt::format("{}: tensor {} is [{}]; this run's model has [{}]",
                                              file, name, fmt::join(it->shape, ", "),
                                              fmt::join(meta.sizes(), ", ")));
  }
  for (const auto& t : header.tensors) {
    const bool known = std::any_of(expected.begin(), expected.end(),
                                   [&](const auto& e) { return e.first == t.name; });
    const bool ignored =
        std::any_of(family.ignored.begin(), family.ignored.end(),
                    [&](const std::string& tail) { return hf_name_ends_with(t.name, tail); }) ||
        (config.shape.tie_head && t.name == "lm_head.weight"); // a tied head's copy
    if (!known && !ignored)
      throw std::invalid_argument(fmt::format("{} holds a tensor {} that this run's model has not",
                                              file, printable(t.name)));
  }
  return expected;
}

} // namespace

std::string hf_architecture(const std::string& model) {
  const HfFamily* f = find_hf_family(model);
  return f ? f->architecture : "";
}

HfFolder hf_folder(const TrainConfig& config, const ExportedModel& model) {
  const HfFamily& family = hf_family_for(config, "--hf");
  NamedTensors params;
  for (const auto& e : model.entries)
    params.emplace_back(e.key, e.value);
  GpuGuard host(nullptr);
  const NamedTensors hf = family.to_hf(params, hf_resolved_shape(config));
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [name, value] : hf) {
    const torch::Tensor t = value.contiguous().cpu();
    tensors.push_back({name, hf_dtype_of(t).safetensors, t.sizes().vec(),
                       std::string(static_cast<const char*>(t.data_ptr()), t.nbytes())});
  }
  HfFolder out;
  out.tensors = static_cast<int64_t>(tensors.size());
  out.safetensors = safetensors_bytes(tensors, {{"format", "pt"}});
  const std::string dtype = hf.empty() ? "float32" : hf_dtype_of(hf.front().second).torch_name;
  out.config_json = family.config(hf_resolved_shape(config), dtype).dump(2) + "\n";
  return out;
}

void write_hf_folder(const fs::path& dir, const HfFolder& folder) {
  std::error_code ec;
  fs::create_directory(dir, ec);
  if (ec && !fs::is_directory(dir))
    throw std::runtime_error(
        fmt::format("cannot make the folder {}: {}", printable(dir.string()), ec.message()));
  // The weights first: a folder whose config.json is there holds the weights it describes.
  write_file_atomic(dir / "model.safetensors", folder.safetensors);
  write_file_atomic(dir / "config.json", folder.config_json);
}

void check_hf_folder(const TrainConfig& config, const fs::path& dir) {
  GpuGuard host(nullptr);
  check_hf_folder_parts(config, dir);
}

NamedTensors read_hf_weights(const TrainConfig& config, const fs::path& dir) {
  GpuGuard host(nullptr); // the weights are the host's until a model copies them
  const NamedTensors expected = check_hf_folder_parts(config, dir);
  const SafetensorsFile file = read_safetensors((dir / "model.safetensors").string());
  NamedTensors hf;
  for (const auto& [name, meta] : expected) {
    for (const auto& t : file.tensors) {
      if (t.name != name)
        continue;
      torch::Tensor value =
          torch::empty(t.shape, torch::TensorOptions().dtype(hf_dtype_named(t.dtype)->dtype));
      std::memcpy(value.data_ptr(), t.data.data(), t.data.size());
      hf.emplace_back(name, value);
    }
  }
  return find_hf_family(config.model)->from_hf(hf, hf_resolved_shape(config));
}

} // namespace meshsim
