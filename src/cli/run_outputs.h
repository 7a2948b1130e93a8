// What `meshsim train` writes into its run folder at the end (summary.json, memory.png,
// report.html, the memory snapshots), from this process's mesh or merged from the parts a run
// made of processes wrote (launch/run_parts.h); and the tidying of a folder a resumed run
// writes into again.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "memory/category.h"
#include "memory/timeline.h"
#include "mesh/device_mesh.h"
#include "report/run_folder.h"
#include "config/config.h"
#include "launch/run_parts.h"
#include "train/trainer.h"

namespace meshsim {

/// A resumed run that writes into the folder it resumes: metrics.jsonl keeps the lines up to
/// the checkpoint's step, so no step appears twice. Written atomically.
void truncate_metrics(const std::filesystem::path& dir, int64_t step);

/// summary.json's "collectives": calls and bytes per op, of rank 0.
nlohmann::json collectives_json(const std::vector<Recorder>& recorders);

/// What the run folder says of every GPU.
struct GpuFigures {
  std::vector<int64_t> capacities;
  std::vector<CategoryBytes> peaks;
  nlohmann::json gpus = nlohmann::json::array();  // summary.json's entries
  std::vector<MemorySample> samples;
  const std::vector<Recorder>* recorders = nullptr;
};

/// From this process's mesh (`result` may be null: a run that failed before it had one).
GpuFigures figures_of(DeviceMesh& mesh, const TrainResult* result);
/// Merged from every process's part.
GpuFigures figures_of(const std::vector<RunPart>& parts, const MergedRun& merged);

/// This process's rank's part of a run made of processes.
RunPart part_of(DeviceMesh& mesh, int rank, const TrainResult* result);

/// summary.json (with `figures`' GPUs), memory.png, the memory snapshots and report.html.
/// Only summary.json's failure throws: a picture or a page that cannot be written is a
/// warning.
void write_outputs(RunFolder& run, DeviceMesh& mesh, const TrainConfig& config,
                   nlohmann::json summary, const GpuFigures& figures);

} // namespace meshsim
