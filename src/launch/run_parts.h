// A run made of processes (--backend c10d): each process writes its rank's part of the run
// folder, ranks/rank-R.json, and rank 0 merges the parts into the files a simulated run
// writes (summary.json's GPUs, memory.csv, trace.json, records.json, and a mixture of experts'
// routing.csv), on rank 0's clock.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "memory/category.h"
#include "memory/timeline.h"
#include "report/routing.h"

namespace meshsim {

struct RunPart {
  int rank = 0;
  double clock_start_unix_s = 0;  // when the process's run clock started, on the system clock
  nlohmann::json gpu;             // summary.json's entry for the rank's GPU
  int64_t capacity = 0;
  CategoryBytes peak_by_category{};
  Recorder recorder;
  std::vector<MemorySample> samples;  // the process's memory.csv rows (its GPU's column)
  std::vector<RoutingRecord> routing; // its MoE layers' routing, every step (none without)
};

/// <run>/ranks/rank-R.json, written atomically.
void write_run_part(const std::filesystem::path& run_dir, const RunPart& part);
/// Rank `rank`'s part from its file's text. Throws (JsonError, nlohmann's, std::runtime_error)
/// for text that is not a part of that rank of a world of `world_size`.
RunPart parse_run_part(const std::string& text, int rank, int world_size);
/// The parts of ranks 0..world_size-1; a missing or unreadable one throws DataError naming it.
std::vector<RunPart> read_run_parts(const std::filesystem::path& run_dir, int world_size);

struct MergedRun {
  std::vector<Recorder> recorders;  // one per rank, times on rank 0's clock
  std::vector<MemorySample> samples;  // every GPU's bytes at each instant a process sampled
  std::vector<RoutingRecord> routing; // every rank's routing records
};

/// One run from its parts: each part's times shifted onto parts[0]'s clock; a memory row per
/// part's row, holding for every GPU the last bytes its own process sampled.
MergedRun merge_run_parts(const std::vector<RunPart>& parts);

} // namespace meshsim
