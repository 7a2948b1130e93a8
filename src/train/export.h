// `meshsim export`: a run's trained model as a PyTorch state_dict. The latest checkpoint is
// loaded into the run's own layout on the CPU, every rank its part, exactly as a resume loads
// it; the strategy then gathers the whole parameters on rank 0 (tensor shards, pipeline
// stages, ZeRO shards), and each is named as the model's plain PyTorch definition names it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"

namespace meshsim {

struct StateDictEntry {
  std::string key;     // PyTorch's state_dict key: "block0.attn.q.weight", "0.weight"
  torch::Tensor value; // whole, contiguous, on the CPU, in the model's dtype
};

struct ExportedModel {
  int64_t step = 0;                    // the checkpoint's step
  std::vector<StateDictEntry> entries; // in the model's parameter order
};

/// The state_dict key of meshsim's parameter `name` of `model` in the model's PyTorch
/// definition. The cnn is a positional nn.Sequential there (its children are numbered: conv1
/// is "0"); lenet is PyTorch's MNIST example (conv1, conv2, fc1, fc2); gpt and llama are
/// tests/models/reference_gpt.py and reference_llama.py, which name their modules as meshsim
/// does. `names` are the model's top-level children in order (for the cnn's numbers).
std::string python_key(const std::string& model, const std::vector<std::string>& names,
                       const std::string& name);

/// The trained model in the latest checkpoint of the run folder `run_dir`, trained with
/// `config` (its config.json). Throws std::invalid_argument when the run has no checkpoint,
/// DataError (one line) for a damaged checkpoint or one that is not `config`'s, and
/// std::runtime_error for anything else (a part that does not fit).
ExportedModel export_model(TrainConfig config, const std::filesystem::path& run_dir);

/// The bytes Python's torch.load reads as a dict of tensors, key by key (the zip format of
/// torch.save, an untagged dict: PyTorch 2.6+'s default weights_only=True load takes it).
std::string state_dict_bytes(const ExportedModel& model);

} // namespace meshsim
