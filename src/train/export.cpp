// The trained model of a run folder, gathered from its checkpoint's parts and named for
// PyTorch.
#include "train/export.h"

#include <chrono>
#include <mutex>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h> // fmt::join (in fmt/format.h before fmt 11)
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include "data/dataset.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/family.h"
#include "models/models.h"
#include "parallel/strategy.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace meshsim {
namespace {

// The unsplit model's parameters with their names, each tensor once, in parameters() order:
// the order full_parameters() returns them in. Transformers are built on the meta device
// (names and shapes, no weights); the convolutional nets, which cannot be, are small.
std::vector<std::pair<std::string, std::vector<int64_t>>>
whole_parameters(const TrainConfig& config, std::vector<std::string>* children) {
  ModelOptions options;
  options.shape = config.shape;
  if (model_family(config.model).transformer)
    options.device = torch::kMeta;
  GpuGuard host(nullptr); // a description, not any GPU's memory
  torch::nn::Sequential model = build_model(config.model, options);
  for (const auto& child : model->named_children())
    children->push_back(child.key());
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : model->named_parameters())
    if (seen.insert(item.value().unsafeGetTensorImpl()).second)
      out.emplace_back(item.key(), item.value().sizes().vec());
  return out;
}

} // namespace

std::string python_key(const std::string& model, const std::vector<std::string>& names,
                       const std::string& name) {
  if (!model_family(model).numbered_children)
    return name;
  const auto dot = name.find('.');
  const std::string child = name.substr(0, dot);
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == child)
      return std::to_string(i) + (dot == std::string::npos ? "" : name.substr(dot));
  throw std::invalid_argument("the cnn has no child '" + child + "'");
}

ExportedModel export_model(TrainConfig config, const fs::path& run_dir) {
  if (!fs::is_regular_file(run_dir / "checkpoint" / "latest"))
    throw std::invalid_argument(
        fmt::format("{} has no checkpoint (no checkpoint/latest): a run writes one at its end, "
                    "and every --checkpoint-every steps",
                    run_dir.string()));
  // The run folder's config.json says what wrote the checkpoint: a checkpoint that disagrees
  // with it, like one whose bytes changed, is a damaged run folder.
  VerifiedCheckpoint checkpoint;
  try {
    checkpoint = verify_checkpoint(run_dir, checkpoint_identity(config), config.gpus, "export");
  } catch (const std::invalid_argument& e) {
    throw DataError(e.what());
  }

  // The run's own layout on the CPU, whatever device trained it: the parts load as a resume
  // loads them, and the strategy gathers them as the trainer's final parameters are gathered.
  config.device = "cpu";
  install_accounting_allocator();
  MeshOptions mesh_options;
  mesh_options.world_size = config.gpus;
  mesh_options.device = "cpu";
  mesh_options.timeline = false;
  mesh_options.comm_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000));
  DeviceMesh mesh(mesh_options);
  const StrategyOptions options = strategy_options(config);
  std::vector<torch::Tensor> gathered;
  std::mutex gathered_mutex;
  run_ranks(mesh, [&](RankContext& ctx) {
    auto strategy = make_strategy(config.strategy, ctx, options);
    load_checkpoint(checkpoint, ctx, *strategy);
    std::vector<torch::Tensor> parameters;
    {
      // The copies are the export's, not GPU memory, and outlive the mesh: a parameter
      // full_parameters() hands back as it is (a replicated one) is copied too.
      GpuGuard host(nullptr);
      parameters = strategy->full_parameters();
      for (auto& p : parameters)
        p = p.detach().clone();
    }
    if (ctx.rank == 0) {
      std::lock_guard<std::mutex> lock(gathered_mutex);
      gathered = std::move(parameters);
    }
  });

  std::vector<std::string> children;
  const auto named = whole_parameters(config, &children);
  if (gathered.size() != named.size())
    throw std::runtime_error(fmt::format("the run's layout gathered {} parameters; {} has {}",
                                         gathered.size(), config.model, named.size()));
  ExportedModel out;
  out.step = checkpoint.manifest.step;
  GpuGuard host(nullptr);
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, shape] = named[i];
    if (!gathered[i].sizes().equals(shape))
      throw std::runtime_error(fmt::format("parameter {} was gathered as [{}], the model has [{}]",
                                           name, fmt::join(gathered[i].sizes(), ", "),
                                           fmt::join(shape, ", ")));
    out.entries.push_back({python_key(config.model, children, name),
                           gathered[i].detach().to(torch::kCPU).contiguous()});
  }
  return out;
}

std::string state_dict_bytes(const ExportedModel& model) {
  c10::Dict<std::string, at::Tensor> dict; // keeps the insertion order, as a state_dict does
  for (const auto& entry : model.entries)
    dict.insert(entry.key, entry.value);
  GpuGuard host(nullptr);
  // torch::pickle_save, but with the dict untagged: its Pickler wraps every dict in
  // torch.jit._pickle.restore_type_tag(dict, "Dict[str, Tensor]"), a global that PyTorch
  // 2.6+'s torch.load (weights_only=True by default) refuses. A plain dict of tensors loads
  // there and in every earlier version alike.
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string bytes;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return bytes;
}

} // namespace meshsim
