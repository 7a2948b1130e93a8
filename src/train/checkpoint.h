// Checkpoints: model parameters, optimizer state and position in training, written
// atomically (temporary file or folder, then rename) under <run>/checkpoint/, with a
// `latest` file naming the newest one. A strategy whose state is whole on rank 0 has one
// file per checkpoint, step-N.pt; one whose state is split across ranks (tensor, pipeline,
// ZeRO) has a folder, step-N/, with one rank-R.pt per rank.
#pragma once

#include <filesystem>
#include <string>

#include <torch/torch.h>

#include "mesh/rank_runner.h"
#include "parallel/strategy.h"
#include "train/optimizer.h"

namespace meshsim {

struct TrainPosition {
  int64_t step = 0;  // global steps completed
};

/// `dropout_rng`, when not empty, is every rank's dropout generator states, one row per rank
/// (models.h: dropout_rng_state).
void save_checkpoint(const std::filesystem::path& run_dir, torch::nn::Module& model,
                     const Optimizer* optimizer, const TrainPosition& position,
                     const torch::Tensor& dropout_rng = {});

/// `path` is a run folder, its checkpoint/ folder, or a checkpoint file. Loads into `model`
/// and (if given) `optimizer`; `dropout_rng` (if given) receives the saved dropout states,
/// or an undefined tensor when there are none. Throws std::runtime_error with a one-line
/// message.
TrainPosition load_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                              Optimizer* optimizer, torch::Tensor* dropout_rng = nullptr);

/// Every rank writes its part (Strategy::save_state) to <run>/checkpoint/step-N/rank-R.pt.
/// Collective over the world: the folder is filled under a temporary name and renamed by
/// rank 0 once every rank has written, so a step-N/ folder is always complete.
void save_rank_checkpoint(const std::filesystem::path& run_dir, RankContext& ctx,
                          Strategy& strategy, const TrainPosition& position);

/// Loads this rank's part from what save_rank_checkpoint wrote; `path` as for
/// load_checkpoint. Collective over the world. Throws std::runtime_error with a one-line
/// message, also when the checkpoint was written by another layout.
TrainPosition load_rank_checkpoint(const std::filesystem::path& path, RankContext& ctx,
                                   Strategy& strategy);

/// The checkpoint `path` refers to (see load_checkpoint): a file, or a per-rank folder.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

} // namespace meshsim
