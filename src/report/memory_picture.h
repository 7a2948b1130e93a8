// memory.png: what a run's memory is, on which GPU, and when in a step.
//
// Three panels, drawn by gnuplot (memory_report.h runs it):
//   1. One representative training step (the second-to-last, as the cost model replays), per
//      GPU: its memory after each of its own phases (batch, forward, backward, each bucket's
//      all-reduce, the optimizer; a pipeline's 0F0, 0B0, ...) as bars stacked by category, so
//      forward's climb, backward's release, the buckets and the optimizer step can be seen.
//      GPUs whose step is the same, phase for phase and byte for byte, share one panel
//      ("gpu1-gpu63"), so 64 data-parallel GPUs are one panel and a pipeline's stages are one
//      each. At most kMaxStepPanels panels; the rest are named in a note.
//   2. The training peak of every GPU's categories (each category's own peak, as summary.json's
//      peak_by_category), stacked, side by side: DataParallel's GPU 0, a pipeline's stages and
//      ZeRO's shards differ at a glance.
//   3. The whole run as a strip: each step's peak of every panel's GPUs (and the card's NVML
//      reading on CUDA runs), not every sample.
// A capacity is drawn as a dashed line where it is within kCapacityInRange times the panel's
// highest bar, and otherwise written in the panel's title.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/recorder.h"
#include "memory/category.h"
#include "memory/timeline.h"

namespace meshsim {

constexpr int kMaxStepPanels = 8;
constexpr double kCapacityInRange = 2.0;

struct MemoryPictureInput {
  std::vector<MemorySample> samples;  // with `rank` and `by_category`
  std::vector<int64_t> capacities;    // per GPU; 0: none
  std::vector<CategoryBytes> peaks;   // per GPU: the training peak by category
  std::string title;
};

/// GPUs that went through the representative step the same way: `gpus` in rank order.
struct StepClass {
  std::vector<int> gpus;
  std::vector<std::string> phases;    // the step's phases, in order
  std::vector<CategoryBytes> bytes;   // the GPU's bytes by category after each phase
};

/// The step panel 1 draws: the second-to-last training step (step >= 1) among the samples, or
/// the only one; -1 when no sample is of a training step.
int64_t picture_step(const std::vector<MemorySample>& samples);

/// The GPUs of `samples` grouped by their course through `step`: a GPU's course is the
/// samples its own rank took in that step (every sample of the step when its rank took none,
/// as DataParallel's one controlling thread does). Classes are in order of their first GPU.
std::vector<StepClass> step_classes(const std::vector<MemorySample>& samples, int64_t step);

/// "gpu0", "gpu1-gpu3", "gpu0, gpu4-gpu7": a sorted list of GPUs, runs joined.
std::string gpu_ranges(const std::vector<int>& gpus);

/// The gnuplot script for memory.png (data inline), drawing into `output_png`. Throws
/// std::invalid_argument when no sample has bytes by category.
std::string memory_picture_script(const MemoryPictureInput& input,
                                  const std::filesystem::path& output_png);

/// Draws memory.png (memory_picture_script, run by run_gnuplot): atomically, the script
/// removed either way. False and a one-line *error on any failure; never throws.
bool plot_memory_picture(const std::filesystem::path& png, const MemoryPictureInput& input,
                         std::string* error);

} // namespace meshsim
