// The manifest of a checkpoint: what wrote it (model, optimizer, layout, step) and, for every
// file in it, its owner rank, size and CRC-32C. A resume reads the manifest first and refuses
// a checkpoint that another layout wrote, or one whose bytes changed, before any run starts.
//
// A checkpoint is a folder checkpoint/step-NNNNNNNN/ holding manifest.json and either
// model.pt (the whole model, written by rank 0) or one rank-R.pt per rank (a state split
// across ranks: tensor, pipeline, ZeRO). The .pt files are plain LibTorch archives.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace meshsim {

constexpr const char* kCheckpointFormat = "meshsim checkpoint 1";
constexpr const char* kWholeCheckpoint = "whole";      // model.pt, written by rank 0
constexpr const char* kPerRankCheckpoint = "per-rank"; // rank-R.pt, one per rank

/// What a checkpoint belongs to. Two checkpoints can be swapped for each other only when
/// every field is equal (for whole checkpoints the number of GPUs may differ).
struct CheckpointIdentity {
  std::string kind;      // kWholeCheckpoint or kPerRankCheckpoint
  std::string model;     // the model and every option that decides its shapes
  std::string optimizer; // adam | sgd: the optimizer state's layout
  std::string layout;    // per-rank: GPUs, dp × tp × pp, ZeRO stage, bucket size; whole: ""
};

struct CheckpointPart {
  std::string file; // model.pt or rank-R.pt, inside the checkpoint's folder
  int rank = 0;     // the rank whose state it holds (0 for model.pt)
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct CheckpointManifest {
  int64_t step = 0;   // global steps completed
  int world_size = 0; // GPUs of the run that wrote it
  CheckpointIdentity identity;
  std::vector<CheckpointPart> parts; // sorted by rank
};

/// The step folder's name: step-00000042.
std::string checkpoint_name(int64_t step);

std::string manifest_to_json(const CheckpointManifest& manifest);

/// Parses manifest.json's text. Throws DataError (one line) for anything that is not a
/// manifest this version wrote: bad JSON, a missing or mistyped field, a file name that
/// leaves the folder, ranks that are not 0..world-1 exactly once.
CheckpointManifest parse_manifest(const std::string& text);

/// Throws DataError (one line) unless `bytes` are the part's: same size, same CRC-32C.
void check_part_bytes(const std::string& bytes, const CheckpointPart& part);

/// Reads `folder`/`part.file` and checks it (check_part_bytes). Throws DataError.
std::string read_part(const std::filesystem::path& folder, const CheckpointPart& part);

} // namespace meshsim
