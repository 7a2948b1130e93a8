// Checkpoints: model parameters, optimizer state and position in training, under
// <run>/checkpoint/step-NNNNNNNN/, with a `latest` file naming the newest complete one.
//
// A step folder holds manifest.json (train/checkpoint_manifest.h: what wrote it, and each
// file's owner rank, size and CRC-32C) and either model.pt (a strategy whose state is whole
// on rank 0) or one rank-R.pt per rank (a state split across ranks: tensor, pipeline, ZeRO).
// The folder is filled under a temporary name and renamed once complete, then `latest` is
// replaced atomically: whenever the process dies, `latest` names a complete checkpoint.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mesh/rank_runner.h"
#include "parallel/strategy.h"
#include "train/checkpoint_manifest.h"
#include "config/config.h"

namespace meshsim {

struct TrainPosition {
  int64_t step = 0; // global steps completed
};

/// What a run of `config` writes into its checkpoints and expects of one it resumes.
CheckpointIdentity checkpoint_identity(const TrainConfig& config);

/// A checkpoint whose manifest and parts verify_checkpoint has checked. The parts' bytes
/// are kept so the ranks load what was checked without reading the files again.
struct VerifiedCheckpoint {
  std::filesystem::path folder; // checkpoint/step-NNNNNNNN
  CheckpointManifest manifest;
  std::vector<std::string> part_bytes; // manifest.parts[i]'s file; emptied once loaded
  std::string action = "resume from";  // what verified it: "resume from" or "export"
};

/// `path` is a run folder, its checkpoint/ folder, or a checkpoint's step folder. Checks,
/// before anything runs, that a run with `expected` on `world_size` GPUs can resume from it
/// and that every part is whole (size, CRC-32C) and holds its own rank's state of that step.
/// Throws std::invalid_argument (nothing to resume, or another model, optimizer or layout)
/// or DataError (a damaged or misplaced file), each one line naming the checkpoint and
/// starting "cannot `action` <folder>".
VerifiedCheckpoint verify_checkpoint(const std::filesystem::path& path,
                                     const CheckpointIdentity& expected, int world_size,
                                     const std::string& action = "resume from");

/// The step folder `path` refers to (see verify_checkpoint), through checkpoint/latest.
/// Throws std::invalid_argument when there is none.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

/// Collective over the world: writes the checkpoint of `step` (whole on rank 0, or one part
/// per rank), then rank 0 writes its manifest, publishes it and, with `keep` > 0, removes
/// all but the newest `keep` checkpoints. A failed write throws on the rank that hit it
/// (std::runtime_error, one line) and leaves only a temporary folder (tidy_checkpoints).
void save_checkpoint(const std::filesystem::path& run_dir, RankContext& ctx, Strategy& strategy,
                     const CheckpointIdentity& identity, int64_t step, int64_t keep = 0);

/// Collective over the world: every rank loads its model, optimizer and dropout state from
/// the checked bytes (concurrent ranks only read `checkpoint`).
/// Throws std::runtime_error (one line) for a part that does not fit.
TrainPosition load_checkpoint(const VerifiedCheckpoint& checkpoint, RankContext& ctx,
                              Strategy& strategy);

/// Removes what an unfinished write left in <run>/checkpoint/ (temporary folders and files,
/// from a failure or a killed process). With `resume_step` >= 0 the run goes on from that
/// step in the same folder: checkpoints after it are removed too, and `latest` names it.
void tidy_checkpoints(const std::filesystem::path& run_dir, int64_t resume_step = -1);

} // namespace meshsim
