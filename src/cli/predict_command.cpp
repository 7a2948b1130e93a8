// `meshsim predict RUN_DIR --cluster SPEC`, and what `meshsim train` writes at the end of a
// run for it: records.json (every rank's records), trace.json (the measured timeline and,
// with --cluster, the predicted step) and summary.json's "prediction".
#include <limits>

#include <fmt/format.h>

#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"
#include "cli/commands.h"
#include "cli/integer_flag.h"
#include "memory/category.h"
#include "memory/virtual_gpu.h"
#include "cost/predict.h"
#include "base/atomic_file.h"
#include "report/trace.h"

namespace meshsim {
namespace {

ClusterSpec cluster_of(const std::string& spec, const std::string& intra,
                       const std::string& inter) {
  ClusterSpec cluster = parse_cluster_spec(spec, intra, inter);
  if (!cluster.note.empty()) fmt::print(stderr, "meshsim: {}\n", cluster.note);
  return cluster;
}

void print_prediction(const Prediction& p) {
  fmt::print(stderr,
             "meshsim: predicted on {}: step {:.3f} ms, {:.0f} samples/s, {:.2f} TFLOP/s per GPU "
             "(MFU {:.1f}%), exposed communication {:.3f} ms, compute idle {:.1f}%\n",
             p.cluster, p.step_time_s * 1e3, p.samples_per_s, p.tflops_per_gpu, 100 * p.mfu,
             p.exposed_comm_s * 1e3, 100 * p.bubble_fraction);
}

// A run folder's records.json. A folder without one is not a run folder (exit 2); one that is
// not a regular file of a sane size, or not JSON, is damaged data (exit 3).
nlohmann::json read_records(const std::filesystem::path& dir) {
  if (const std::string why = folder_problem(dir.string()); !why.empty())
    throw std::invalid_argument(
        fmt::format("{} is not a run folder: it {}", printable(dir.string()), why));
  const auto path = dir / "records.json";
  if (path_kind(path.string()) == PathKind::kNothing)
    throw std::invalid_argument(fmt::format("{} is not a run folder of meshsim train: it has no "
                                            "records.json",
                                            printable(dir.string())));
  return parse_json(read_input_file(path.string(), "records", kMaxRecordsBytes),
                    printable(path.string()));
}

} // namespace

void write_run_reports(const std::filesystem::path& dir, const TrainConfig& config,
                       const std::vector<Recorder>& recorders,
                       const std::vector<MemorySample>& memory, nlohmann::json& summary) {
  const int64_t samples_per_step = config.batch_size * (config.gpus / (config.tp * config.pp * config.cp));
  nlohmann::json trace;
  try {
    write_file_atomic(dir / "records.json",
                      records_to_json(recorders, samples_per_step).dump() + "\n");
    trace = chrome_trace(recorders, memory, "measured");
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: warning: records.json or trace.json not written: {}\n", e.what());
    return;
  }
  if (!config.cluster.empty()) {
    try {
      const Prediction p = predict(recorders, samples_per_step,
                                   cluster_of(config.cluster, config.intra, config.inter));
      summary["prediction"] = to_json(p);
      print_prediction(p);
      // The predicted step sits beside the measured one, under pids offset by the GPU count.
      const nlohmann::json predicted = chrome_trace(
          p.timeline, {}, fmt::format("predicted {}, step {}", p.cluster, p.step), config.gpus);
      for (const auto& e : predicted["traceEvents"])
        trace["traceEvents"].push_back(e);
      trace["otherData"]["predicted"] = predicted["otherData"];
    } catch (const std::exception& e) {
      fmt::print(stderr, "meshsim: warning: no prediction: {}\n", e.what());
    }
  }
  try {
    write_chrome_trace(dir / "trace.json", trace);
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: warning: trace.json not written: {}\n", e.what());
  }
}

void add_predict_flags(CLI::App& app, PredictArgs& a) {
  app.add_option("run_dir", a.run_dir, "a run folder written by meshsim train")->required();
  app.add_option("--cluster", a.cluster, "target cluster: NODESxGPUSxMODEL, GPUSxMODEL or MODEL")
      ->required();
  app.add_option("--intra", a.intra, "link between GPUs of a node (default: the GPU's usual one)");
  app.add_option("--inter", a.inter, "link between nodes (default: the GPU's usual one)");
  add_integer_flag(app, "--gpus", a.gpus,
                   "data-parallel runs only: replay on this many GPUs (same per-GPU batch)",
                   /*min=*/1)
      ->check(CLI::Range(1, kMaxPlannedGpus));
  app.add_option("--dtype", a.dtype, "math of the target run: fp32 | tf32 | bf16 | fp16")
      ->capture_default_str();
  add_integer_flag(app, "--step", a.step, "the recorded step to replay (default: the second-to-last)",
                   /*min=*/1);
  app.add_flag("--measured-compute", a.measured_compute,
               "keep the measured compute times (the target is this device)");
  app.add_flag("--no-overlap", a.no_overlap, "DDP buckets wait for the whole backward");
}

// Replaying on `gpus` ranks copies one rank's record per rank, and every collective names
// its group: the memory grows as gpus². Refuse, before allocating, a replay the host cannot
// hold.
void check_replay_fits(const Recorder& one, int gpus) {
  int64_t per_rank = static_cast<int64_t>(sizeof(Recorder));
  for (const auto& c : one.compute)
    per_rank += static_cast<int64_t>(sizeof(c) + c.layers.size() * sizeof(LayerWork));
  per_rank += static_cast<int64_t>(one.collectives.size()) *
              static_cast<int64_t>(sizeof(CollectiveRecord) + sizeof(int) * gpus);
  // The replay keeps a few times the records in events and queues; 4x is its working set.
  const double need = 4.0 * static_cast<double>(per_rank) * gpus;
  const int64_t have = host_memory_for_gpus();
  if (need > static_cast<double>(have))
    throw std::invalid_argument(fmt::format(
        "--gpus {}: replaying {} ranks needs about {} of memory and this machine has {} "
        "available; ask for fewer GPUs",
        gpus, gpus, format_bytes(static_cast<int64_t>(std::min(need, 9e18))), format_bytes(have)));
}

int run_predict(const PredictArgs& a) {
  try {
    const std::filesystem::path dir(a.run_dir);
    int64_t samples_per_step = 0;
    std::vector<Recorder> ranks = records_from_json(read_records(dir), &samples_per_step);
    if (a.gpus > 0 && a.gpus != static_cast<int>(ranks.size())) {
      check_replay_fits(ranks.front(), a.gpus);
      samples_per_step = samples_per_step / static_cast<int64_t>(ranks.size()) * a.gpus;
      ranks = resize_data_parallel(ranks, a.gpus);
    }
    PredictOptions options;
    options.dtype = parse_dtype(a.dtype);
    // A recorded run's layers do not say which of their GEMMs are the attention core's.
    if (options.dtype == Dtype::FP8)
      throw std::invalid_argument(
          "--dtype fp8 is for plans (meshsim plan --precision fp8); predict a run at bf16");
    options.step = a.step;
    options.measured_compute = a.measured_compute;
    options.overlap_buckets = !a.no_overlap;
    const Prediction p =
        predict(ranks, samples_per_step, cluster_of(a.cluster, a.intra, a.inter), options);
    check_prediction(p);
    print_prediction(p);
    fmt::print("{}\n", to_json(p).dump(2));
    return kExitOk;
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

} // namespace meshsim
