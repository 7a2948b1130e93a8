// Checkpoints: model parameters, optimizer state and position in training, written
// atomically (temporary file, then rename) under <run>/checkpoint/, with a `latest` file
// naming the newest one.
#pragma once

#include <filesystem>
#include <string>

#include <torch/torch.h>

#include "train/optimizer.h"

namespace meshsim {

struct TrainPosition {
  int64_t step = 0;  // global steps completed
};

void save_checkpoint(const std::filesystem::path& run_dir, torch::nn::Module& model,
                     const Optimizer* optimizer, const TrainPosition& position);

/// `path` is a run folder, its checkpoint/ folder, or a checkpoint file. Loads into `model`
/// and (if given) `optimizer`. Throws std::runtime_error with a one-line message.
TrainPosition load_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                              Optimizer* optimizer);

/// The checkpoint file `path` refers to (see load_checkpoint).
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

} // namespace meshsim
