// memory.csv and memory.png: every virtual GPU's live bytes over the run.
//
// The CSV is the data of record (one row per MemoryTimeline sample); the PNG is drawn by
// gnuplot (Debian gnuplot-nox, pngcairo terminal) so meshsim needs no plotting library. A
// missing or failing gnuplot costs the picture, never the run: plot_memory reports, never throws.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "comm/recorder.h"
#include "memory/timeline.h"

namespace meshsim {

/// memory.csv text: header `time_s,step,phase,gpu0_mib,gpu1_mib,...,phys_used_mib,phys_util_pct`,
/// one row per sample in the given order, time with 6 decimals, MiB with 3, utilisation a whole
/// percent; the last two cells are the card's NVML reading, empty when the sample has none.
/// Throws std::invalid_argument if a sample does not have exactly num_gpus byte counts.
std::string memory_csv(const std::vector<MemorySample>& samples, int num_gpus);
/// memory_csv, written atomically (write_file_atomic).
void write_memory_csv(const std::filesystem::path& path, const std::vector<MemorySample>& samples,
                      int num_gpus);

/// The gnuplot script plot_memory runs (data inline), drawing into `output_png`: one line per
/// GPU, time (s) on x, MiB on y, each capacity (> 0) a dashed horizontal line in its GPU's
/// colour, or one black line labelled "capacity" when all are equal. A capacity more than
/// 20x above the highest peak is left off the y-range, and its key entry says "(off scale)".
/// When any sample has the card's NVML reading, the card's used memory is one more line,
/// "card (NVML) used", on the same axis; otherwise the script is as if NVML did not exist.
/// `labels`, when given, names each GPU's line (a plan's "stage 1 (gpu 128)"); else "gpuN".
std::string memory_plot_script(const std::vector<MemorySample>& samples,
                                const std::vector<int64_t>& capacities, const std::string& title,
                                const std::filesystem::path& output_png,
                                const std::vector<std::string>& labels = {});

/// Runs `$MESHSIM_GNUPLOT` (default: gnuplot on PATH) on `script` with stdin from /dev/null,
/// killing it (and its process group) after timeout_ms. False plus a one-line *error when
/// gnuplot is missing, exits non-zero, dies or times out.
bool run_gnuplot(const std::filesystem::path& script, int timeout_ms, std::string* error);

/// A gnuplot single-quoted string ('' for '; control characters become spaces).
std::string gnuplot_quote(const std::string& s);
/// "5.8 GiB", "24.0 MiB": a capacity as a picture labels it.
std::string capacity_text(int64_t bytes);

/// Runs the gnuplot script `script_for(tmp_png)` so that it draws into a temporary file next
/// to `png`, renamed over `png` on success; the script is removed either way. False and a
/// one-line *error on any failure; never throws.
bool draw_with_gnuplot(const std::filesystem::path& png,
                       const std::function<std::string(const std::filesystem::path&)>& script_for,
                       std::string* error);

/// Draws memory.png (see memory_plot_script): writes the script next to `png`, renders into a
/// temporary file and renames it over `png` on success; the script is removed either way.
/// Returns false and sets *error (one line) on any failure; never throws.
bool plot_memory(const std::filesystem::path& png, const std::vector<MemorySample>& samples,
                 const std::vector<int64_t>& capacities, const std::string& title,
                 std::string* error, const std::vector<std::string>& labels = {});

} // namespace meshsim
