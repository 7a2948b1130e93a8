// trace.json: the run's timeline in the Chrome Trace Event Format, for chrome://tracing and
// Perfetto (ui.perfetto.dev).
//
// Each virtual GPU is one process (pid = rank + pid_offset) with two threads: tid 0
// "compute" (forward, backward, optimizer, ...) and tid 1 "communication" (collectives and
// send/recv), plus a "memory (MiB)" counter. The label ("measured", "predicted") names the
// timeline, so a second timeline can sit beside the first under pids offset by the GPU count.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "memory/timeline.h"

namespace meshsim {

/// The trace as a JSON object: {"traceEvents": [...], "displayTimeUnit": "ms",
/// "otherData": {"generator": "meshsim", "label", "num_gpus", "pid_offset"}}.
/// Events, per rank r (pid = r + pid_offset):
///  - metadata ("ph":"M"): process_name "gpu<r> (<label>)" (just "gpu<r>" for an empty
///    label), process_sort_index = pid, thread_name "compute"/"communication" and
///    thread_sort_index 0/1 for tids 0/1;
///  - complete events ("ph":"X") with ts and dur in microseconds (clamped to >= 0):
///    compute records on tid 0 (cat "compute", args {step}), collective records on tid 1
///    (cat "comm", name = op, args {bytes, group "0,1,2,3", seq, peer});
///  - counters ("ph":"C", name "memory (MiB)", args {"gpu<r>": MiB}) on tid 0, one per
///    memory sample.
/// Throws std::invalid_argument if pid_offset < 0 or a memory sample does not hold exactly
/// one byte count per rank.
nlohmann::json chrome_trace(const std::vector<Recorder>& ranks,
                            const std::vector<MemorySample>& memory, const std::string& label,
                            int pid_offset = 0);

/// The trace as compact JSON (invalid UTF-8 in names replaced), written atomically
/// (write_file_atomic). Throws std::runtime_error on failure.
void write_chrome_trace(const std::filesystem::path& path, const nlohmann::json& trace);

/// Checks `trace` against the format's rules and returns one line per problem found (empty
/// = valid; at most 50 lines, the last saying how many more there were). Accepts the object
/// form (traceEvents array, optional displayTimeUnit "ms"/"ns") and the bare array form.
/// Per event: an object with a string "ph" in {X, B, E, C, M, i, I}; integer pid and tid;
/// a string name (except E); numeric finite ts; X: numeric dur >= 0; C: non-empty args
/// object of numbers; M: name in {process_name, thread_name, process_sort_index,
/// thread_sort_index} with args {name: string} or {sort_index: integer}; B/E properly
/// paired per (pid, tid), in ts order (file order for ties).
std::vector<std::string> validate_chrome_trace(const nlohmann::json& trace);

} // namespace meshsim
