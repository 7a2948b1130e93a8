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

namespace meshsim {

struct TrainPosition {
  int64_t step = 0;  // global steps completed
};

/// Collective over the world. A strategy whose state is whole has rank 0 write its model,
/// optimizer state and every rank's dropout generator states to step-N.pt. One whose state
/// is split across ranks (Strategy::checkpoints_per_rank) has every rank write its part to
/// step-N/rank-R.pt; the folder is filled under a temporary name and renamed by rank 0 once
/// every rank has written, so a step-N/ folder is always complete.
void save_checkpoint(const std::filesystem::path& run_dir, RankContext& ctx, Strategy& strategy,
                     const TrainPosition& position);

/// `path` is a run folder, its checkpoint/ folder, or a checkpoint (file or per-rank folder).
/// Every rank loads its model, optimizer and dropout state from it. Collective over the
/// world. Throws std::runtime_error with a one-line message, also when the checkpoint was
/// written by another layout.
TrainPosition load_checkpoint(const std::filesystem::path& path, RankContext& ctx,
                              Strategy& strategy);

/// The checkpoint `path` refers to (see load_checkpoint): a file, or a per-rank folder.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

} // namespace meshsim
