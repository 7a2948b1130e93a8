// The run folder's end-of-run outputs. See run_outputs.h.
#include "cli/run_outputs.h"

#include <chrono>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "base/out_folder.h"
#include "base/printable.h"
#include "cli/commands.h"
#include "memory/virtual_gpu.h"
#include "base/atomic_file.h"
#include "report/html_report.h"
#include "report/memory_snapshot.h"

namespace meshsim {
namespace {

nlohmann::json gpu_json(const VirtualGpu& gpu, const TrainResult* result) {
  const auto s = gpu.stats();
  nlohmann::json by_category;
  for (auto c : kAllCategories) by_category[category_name(c)] = s.peak_by_category[static_cast<size_t>(c)];
  nlohmann::json out = {{"rank", gpu.rank()},
                        {"capacity_bytes", s.capacity},
                        {"peak_bytes", s.peak},
                        {"peak_by_category", by_category},
                        {"allocations", s.allocations}};
  if (gpu.on_card()) // what the GPU's pool took from the card, as memory_reserved counts it
    out["peak_reserved_bytes"] = s.peak_reserved;
  if (result && gpu.rank() < static_cast<int>(result->eval_peak_bytes.size())) {
    out["eval_peak_bytes"] = result->eval_peak_bytes[gpu.rank()];
    out["model_state_bytes"] = result->model_state_bytes[gpu.rank()];
  }
  return out;
}

} // namespace

void check_out_folder(const std::string& out, bool may_hold_files) {
  if (out.empty())
    return;
  if (const std::string why = out_folder_problem(out); !why.empty())
    throw std::invalid_argument(fmt::format("--out {} {}", printable(out), why));
  if (!may_hold_files && is_nonempty_folder(out))
    throw std::invalid_argument(fmt::format(
        "--out {} is not empty; choose a new folder (meshsim never mixes two runs' files)",
        printable(out)));
}

void truncate_metrics(const std::filesystem::path& dir, int64_t step) {
  const auto path = dir / "metrics.jsonl";
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("step", int64_t{0}) <= step) kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

nlohmann::json collectives_json(const std::vector<Recorder>& recorders) {
  std::map<std::string, std::pair<int64_t, int64_t>> by_op;  // calls, bytes (rank 0)
  if (!recorders.empty())
    for (const auto& c : recorders[0].collectives) {
      by_op[c.op].first += 1;
      by_op[c.op].second += c.bytes;
    }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [op, v] : by_op) out[op] = {{"calls", v.first}, {"bytes", v.second}};
  return out;
}

GpuFigures figures_of(DeviceMesh& mesh, const TrainResult* result) {
  GpuFigures f;
  for (int r = 0; r < mesh.world_size(); ++r) {
    f.capacities.push_back(mesh.gpu(r).capacity());
    f.peaks.push_back(mesh.gpu(r).stats().peak_by_category); // as summary.json's
    f.gpus.push_back(gpu_json(mesh.gpu(r), result));
  }
  f.samples = mesh.timeline().samples();
  f.recorders = result ? &result->recorders : nullptr;
  return f;
}

RunPart part_of(DeviceMesh& mesh, int rank, const TrainResult* result) {
  RunPart p;
  p.rank = rank;
  const double unix_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  p.clock_start_unix_s = unix_now - mesh.clock().now();
  p.gpu = gpu_json(mesh.gpu(rank), result);
  p.capacity = mesh.gpu(rank).capacity();
  p.peak_by_category = mesh.gpu(rank).stats().peak_by_category;
  if (result && rank < static_cast<int>(result->recorders.size()))
    p.recorder = result->recorders[rank];
  if (result)
    for (const RoutingRecord& record : result->routing)
      if (record.rank == rank) // a process holds its own rank's records only
        p.routing.push_back(record);
  p.samples = mesh.timeline().samples();
  return p;
}

GpuFigures figures_of(const std::vector<RunPart>& parts, const MergedRun& merged) {
  GpuFigures f;
  for (const RunPart& p : parts) {
    f.capacities.push_back(p.capacity);
    f.peaks.push_back(p.peak_by_category);
    f.gpus.push_back(p.gpu);
  }
  f.samples = merged.samples;
  f.recorders = &merged.recorders;
  return f;
}

void write_outputs(RunFolder& run, DeviceMesh& mesh, const TrainConfig& config,
                   nlohmann::json summary, const GpuFigures& figures) {
  MemoryPictureInput picture;
  picture.capacities = figures.capacities;
  picture.peaks = figures.peaks;
  summary["gpus"] = figures.gpus;
  std::string plot_error;
  const std::string layout =
      uses_mesh_layout(config) ? fmt::format(" (dp={}{} x tp={} x pp={}{}, zero {})",
                                             config.gpus / (config.tp * config.pp * config.cp),
                                             config.cp > 1 ? fmt::format(" x cp={} ({})", config.cp,
                                                                         config.cp_comm)
                                                           : "",
                                             config.tp, config.pp,
                                             config.ep > 1 ? fmt::format(", ep={}", config.ep) : "",
                                             config.zero)
                               : "";
  picture.title = fmt::format("meshsim: {} {} on {} virtual GPUs{}", config.model,
                              config.strategy, config.gpus, layout);
  picture.samples = figures.samples;
  // A run that failed before its first memory sample has nothing to plot: no warning then.
  const bool drawn = run.write_memory(picture, &plot_error);
  if (!drawn && !picture.samples.empty())
    fmt::print(stderr, "meshsim: warning: memory.png not drawn: {}\n", plot_error);
  if (config.memory_snapshot) {
    if (mesh.on_card())
      fmt::print(stderr, "meshsim: warning: --memory-snapshot records CPU virtual GPUs only; on "
                         "the card, PyTorch's torch.cuda.memory._record_memory_history does\n");
    try {
      write_memory_snapshots(run.dir() / "memory_snapshot", mesh);
    } catch (const std::exception& e) {
      fmt::print(stderr, "meshsim: warning: memory snapshot not written: {}\n", e.what());
    }
  }
  run.write_json("summary.json", summary);
  // report.html: everything above in one page; like memory.png, a failure costs only the page.
  HtmlReportInput report;
  report.title = picture.title;
  report.summary = summary;
  report.metrics = read_metrics_lines(run.dir() / "metrics.jsonl");
  report.samples = &picture.samples;
  report.capacities = picture.capacities;
  report.recorders = figures.recorders;
  std::string report_error;
  if (!write_html_report(run.dir() / "report.html", report, &report_error))
    fmt::print(stderr, "meshsim: warning: report.html not written: {}\n", report_error);
}

} // namespace meshsim
