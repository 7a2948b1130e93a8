// The data report.html draws, as one JSON document embedded in the page: the run's summary,
// its loss and throughput, every GPU's memory by category, the collectives by group and
// size, and the prediction. Sized for the page: however many GPUs and steps, it stays a few
// MB (identical GPUs are kept once, full detail only for the steps a budget allows, the run
// as per-step peaks binned to a few hundred columns).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "memory/timeline.h"

namespace meshsim {

/// Limits on what the page embeds.
struct ReportLimits {
  int64_t detail_budget_bytes = 1500000; // per-sample detail of steps, serialized
  int max_metric_points = 2000;          // loss / throughput points
  int max_strip_columns = 400;           // the run's per-step peaks
  int64_t strip_budget_values = 60000;   // numbers in the strip, every group together
};

/// The step the page shows first: the second-to-last step that has samples (the last is
/// often cut short or followed by evaluation), the only one when there is one; -1 for none.
/// The cost model replays the same step (representative_step in cost/step_program.h).
int64_t report_representative_step(const std::vector<MemorySample>& samples);

/// One GPU's peaks as its allocator counted them (summary.json's peak_bytes and
/// peak_by_category): exact, where samples only see phase boundaries.
struct GpuPeak {
  int64_t bytes = 0;
  CategoryBytes by_category{};
};

/// The "memory" object: groups of identical GPUs, each group's stacked categories over
/// every detailed step (time in ms from the step's first sample; a point where the GPU's bytes
/// changed), per-step peaks of the run, and every GPU's peak by category.
/// GPUs are identical when their capacity and allocator peaks (`peaks`, one per GPU) are;
/// without `peaks` (empty), when their samples are (which ranks sampling at different
/// moments can make differ).
nlohmann::json memory_report_data(const std::vector<MemorySample>& samples,
                                  const std::vector<int64_t>& capacities,
                                  const std::vector<GpuPeak>& peaks,
                                  const ReportLimits& limits = {});

/// The collectives of every rank, counted once per group (on the group's first rank; a
/// send/recv pair once, on the sender), by group and op: calls, bytes, seconds, and calls by
/// size (power-of-two bins).
nlohmann::json collectives_report_data(const std::vector<Recorder>& recorders);

/// "0-3", "0,8,…,56", "1→2": a group of ranks, short.
std::string group_label(const std::vector<int>& ranks);

/// [step, loss, samples_per_s, lr] rows of metrics.jsonl's lines, at most `max_points`
/// (evenly thinned, the last line always kept).
nlohmann::json metrics_report_data(const std::vector<nlohmann::json>& lines, int max_points);

} // namespace meshsim
