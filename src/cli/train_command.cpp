// `meshsim train`: validate, load data, run, and write the run folder — also when the run
// fails, so what was measured before the failure is kept.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <optional>
#include <typeinfo>

#include <fmt/format.h>

#include "base/out_folder.h"
#include "cli/commands.h"
#include "cli/run_outputs.h"
#include "cli/train_preflight.h"
#include "config/stage_layers.h"
#include "comm/c10d_backend.h"
#include "comm/communicator.h"
#include "memory/allocator.h"
#include "memory/virtual_gpu.h"
#include "mesh/device_mesh.h"
#include "mesh/parallel_dims.h"
#include "mesh/rank_runner.h"
#include "models/family.h"
#include "models/models.h"
#include "base/atomic_file.h"
#include "report/run_folder.h"
#include "launch/process_env.h"
#include "train/checkpoint.h"
#include "launch/run_parts.h"
#include "train/trainer.h"

namespace meshsim {

namespace {

// --memory-snapshot keeps this many training steps (the last ones) of every GPU's allocations.
constexpr int kSnapshotSteps = 3;

// Set by SIGINT/SIGTERM: the ranks stop after the current step and the run folder is
// written. A second signal ends the process at once.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) {
    remove_temp_files_now(); // a file half written is left as it was
    _exit(kExitSignalBase + sig);
  }
  static const char kSay[] =
      "\nmeshsim: stopping after this step and writing the run folder (again to stop at once)\n";
  const ssize_t ignored = write(STDERR_FILENO, kSay, sizeof(kSay) - 1);
  (void)ignored;
}

// Installs the handlers for one run and puts the previous ones back after it.
class StopSignals {
public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

private:
  struct sigaction old_int_ {}, old_term_ {};
};


// Every process of a run offers its configuration at the rendezvous; all of them compare every
// offer with rank 0's and stop, before anything is trained or written, at the first field of
// the first rank that differs (the same verdict on every process).
void check_same_configuration(const TrainConfig& config, C10dWorld& world) {
  const nlohmann::json mine = configuration_fingerprint(config);
  const std::vector<std::string> all = world.all_gather("configuration", mine.dump());
  const nlohmann::json leader = nlohmann::json::parse(all.front());
  for (size_t r = 1; r < all.size(); ++r)
    if (const auto d = first_difference(leader, nlohmann::json::parse(all[r])))
      throw std::invalid_argument(fmt::format(
          "the processes were started with different configurations: {} is {} on rank {} and {} "
          "on rank 0; start every process of a run with the same train flags",
          d->field, d->b, r, d->a));
}

MeshOptions mesh_options_for(const TrainConfig& config, const std::optional<ProcessPlace>& place) {
  MeshOptions mesh_options;
  mesh_options.world_size = config.gpus;
  mesh_options.capacity_bytes = config.gpu_mem_bytes;
  mesh_options.device = config.device;
  mesh_options.history_steps = config.memory_snapshot ? kSnapshotSteps : 0;
  mesh_options.comm_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000));
  if (place) {
    mesh_options.backend = "c10d";
    mesh_options.c10d.rank = place->rank;
    mesh_options.c10d.world_size = place->world_size;
    mesh_options.c10d.master_addr = place->master_addr;
    mesh_options.c10d.master_port = place->master_port;
    mesh_options.processes_per_host = place->local_world_size;
  }
  return mesh_options;
}

// How long a failed process of a run of processes may take to write its part and tear down
// before it exits regardless (exit_within): writing a part takes well under a second, and a
// teardown that waits on a dead peer would otherwise wait for ever.
constexpr std::chrono::seconds kFailedRankTeardown{20};

// One run of `meshsim train` once its data is loaded: the process's place, its mesh, its run
// folder, and the lines it says.
struct TrainRun {
  TrainConfig config;
  DataSplit data;
  std::optional<VerifiedCheckpoint> resume;
  std::optional<ProcessPlace> place;
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<RunFolder> run;
  // A run of processes: every rank's part, and their merge (figures point into both).
  std::vector<RunPart> parts;
  MergedRun merged;

  bool leader() const { return !place || place->rank == 0; } // writes the shared files
  void say(const std::string& line) const {
    fmt::print(stderr, "meshsim: {}{}\n", place ? fmt::format("rank {}: ", place->rank) : "",
               line);
  }
};

// The leader's run folder. A folder that holds something is another run's: never mix two runs'
// files. Resuming into the folder it resumes keeps its metrics and checkpoints up to the
// checkpoint. Throws std::invalid_argument for a folder it may not use.
std::unique_ptr<RunFolder> open_leader_folder(const TrainRun& r) {
  const TrainConfig& config = r.config;
  if (!config.out.empty() && is_nonempty_folder(config.out)) {
    if (!r.resume)
      throw std::invalid_argument(fmt::format(
          "--out {} is not empty; choose a new folder, or add --resume to continue the run in it",
          config.out));
    const auto resumed_run =
        std::filesystem::weakly_canonical(r.resume->folder).parent_path().parent_path();
    if (std::filesystem::weakly_canonical(config.out) != resumed_run)
      throw std::invalid_argument(fmt::format(
          "--out {} is not empty and is not the folder of the run being resumed ({})",
          config.out, resumed_run.string()));
    truncate_metrics(config.out, r.resume->manifest.step);
    tidy_checkpoints(config.out, r.resume->manifest.step);
  }
  return std::make_unique<RunFolder>(config.out);
}

// The mesh (c10d: the rendezvous, then the same configuration on every process) and the run
// folder, rank 0's shared with the other processes; config.json written.
std::optional<int> open_mesh_and_folder(TrainRun& r) {
  try {
    r.mesh = std::make_unique<DeviceMesh>(mesh_options_for(r.config, r.place));
    if (r.place)
      check_same_configuration(r.config, *r.mesh->c10d_world());
  } catch (const std::exception& e) {
    const Failure f = failure_of(e);
    r.say(f.message);
    return f.code;
  }
  std::string folder_error;
  if (r.leader()) try {
    r.run = open_leader_folder(r);
  } catch (const std::exception& e) {
    folder_error = one_line(e);
  }
  if (r.place) {
    // The other processes write their checkpoint parts and run parts into rank 0's folder.
    try {
      const std::string shared = r.mesh->c10d_world()->share(
          "run-folder", r.run ? r.run->dir().string() : "!" + folder_error);
      if (!r.leader() && shared.rfind('!', 0) == 0)
        return kExitUsage;  // rank 0 says why
      if (!r.leader())
        r.run = std::make_unique<RunFolder>(shared, /*logs=*/false);
    } catch (const CollectiveTimeout& e) {
      r.say(one_line(e));
      return kExitRankFailure;
    } catch (const std::exception& e) {
      r.say(one_line(e));
      return kExitUsage;
    }
  }
  if (!folder_error.empty()) {
    r.say(folder_error);
    return kExitUsage;
  }
  if (r.leader()) {
    nlohmann::json config_json = to_json(r.config);
    config_json["out"] = r.run->dir().string();
    r.run->write_json("config.json", config_json);
  }
  return std::nullopt;
}

// The line that opens a run (the leader's) and summary.json's first fields.
nlohmann::json announce(const TrainRun& r) {
  const TrainConfig& config = r.config;
  DeviceMesh& mesh = *r.mesh;
  const ParallelDims dims = layout_dims(config);
  ModelOptions model_options;
  model_options.shape = config.shape;
  const int64_t parameters = count_parameters(*build_model(config.model, model_options));
  const std::string layout =
      uses_mesh_layout(config)
          ? fmt::format(" as {}{}{}, zero {}{}, {} micro-batches, recompute {}", dims.describe(),
                        std::string(config.sequence_parallel ? " with sequence parallel" : "") +
                            (config.pp_scatter_gather ? ", pipeline messages scattered over tp"
                                                      : ""),
                        (dims.cp > 1 ? " (cp by " + config.cp_comm + ")" : std::string()) +
                            (dims.ep > 1 && config.moe_dispatch != "deepep"
                                 ? " (ep by " + config.moe_dispatch + ")"
                                 : ""),
                        config.zero,
                        (config.reshard_after_forward ? "" : " (no reshard after forward)") +
                            std::string(config.reduce_fp32 ? " (reduced in fp32)" : "") +
                            std::string(config.distributed_optimizer ? " (distributed optimizer)"
                                                                     : "") +
                            std::string(dims.pp > 1
                            ? ", " + config.schedule + " schedule" +
                                  (config.virtual_stages > 1
                                       ? fmt::format(" ({} virtual stages)", config.virtual_stages)
                                       : "")
                            : ""),
                        config.micro_batches, config.recompute)
          : "";
  if (r.leader())
  fmt::print(stderr,
             "meshsim: {} on {} {}{} ({} each, {} device, {} threads per rank), model {} "
             "({} parameters), data {} ({} train / {} test), run folder {}\n",
             config.strategy, config.gpus,
             !r.place ? "virtual GPUs"
             : config.device == "cpu" ? "processes (--backend c10d, Gloo)"
                                      : "processes (--backend c10d, NCCL)", layout,
             format_bytes(mesh.gpu(0).capacity()), config.device,
             threads_per_local_rank(mesh),
             config.preset.empty() ? config.model
                                   : config.model + " (preset " + config.preset + ")",
             parameters, config.data, r.data.train.size(), r.data.test.size(),
             r.run->dir().string());

  return {{"world_size", config.gpus},
          {"strategy", config.strategy},
          {"layout", {{"dp", dims.dp}, {"tp", dims.tp}, {"pp", dims.pp},
                      {"zero", config.zero}, {"dp_shard", dims.dp_shard},
                      {"reshard_after_forward", config.reshard_after_forward},
                      {"reduce_fp32", config.reduce_fp32},
                      {"distributed_optimizer", config.distributed_optimizer},
                      {"pp_scatter_gather", config.pp_scatter_gather},
                      {"schedule", config.schedule},
                      {"virtual_stages", config.virtual_stages},
                      {"stage_layers", stage_layer_counts(config)},
                      {"micro_batches", config.micro_batches},
                      {"recompute", config.recompute},
                      {"sequence_parallel", config.sequence_parallel},
                      {"cp", dims.cp}, {"cp_comm", config.cp_comm}, {"ep", dims.ep},
                       {"moe_dispatch", config.moe_dispatch},
                       {"loss_upcast", config.loss_upcast}}},
          {"model", config.model},
          {"parameters", parameters},
          {"device", config.device},
          {"batch_size", config.batch_size},
          {"global_batch_size", config.batch_size * dims.dp},
          {"backend", config.backend}};
}

// How training went: the exit code and the error that ends the run, if any.
struct Outcome {
  int code = kExitOk;
  std::string error;
  TrainResult result;
  bool trained = false;
};

// routing.csv and summary.json's "routing" of every rank's records.
void write_routing(const std::filesystem::path& dir, const std::vector<RoutingRecord>& routing,
                   nlohmann::json& summary) {
  summary["routing"] = routing_summary(routing);
  write_file_atomic(dir / "routing.csv", routing_csv(routing));
}

// Trains, filling `summary` with what the run measured; a simulated run writes its reports
// here (a run of processes writes them from every process's part, in finish_parts).
Outcome train_into(TrainRun& r, nlohmann::json& summary) {
  Outcome o;
  try {
    o.result = train(r.config, *r.mesh, r.data, r.run.get(), &g_stop_signal, std::move(r.resume));
    const TrainResult& result = o.result;
    o.trained = true;
    summary["status"] = "ok";
    summary["steps"] = result.steps;
    summary["final_loss"] = std::isfinite(result.final_loss) ? nlohmann::json(result.final_loss)
                                                              : nlohmann::json(nullptr);
    summary["test_accuracy"] = result.test_accuracy;
    summary["test_samples"] = result.test_samples;
    summary["train_seconds"] = result.train_seconds;
    summary["collectives"] = collectives_json(result.recorders);
    // A mixture of experts' routing, every step (report/routing.h); a run of processes writes
    // every rank's from their parts (finish_parts).
    if (!result.routing.empty() && !r.place)
      write_routing(r.run->dir(), result.routing, summary);
    if (result.stopped == StopReason::Diverged) {
      o.code = kExitDiverged, o.error = result.stop_message;
      summary.erase("test_accuracy");
      summary.erase("test_samples");
    } else {
      if (result.stopped == StopReason::Signal) summary.erase("test_accuracy");
      if (result.stopped == StopReason::Signal) summary.erase("test_samples");
      if (!r.place)
        write_run_reports(r.run->dir(), r.config, result.recorders, r.mesh->timeline().samples(),
                          summary);
    }
  } catch (const std::exception& e) {
    const Failure f = failure_of(e);
    o.code = f.code, o.error = f.message;
  }
  return o;
}

// A run of processes: every process writes its rank's part; once all have (a run that went
// well), rank 0 merges them into the files a simulated run writes. True when this process is
// done (not the leader); `figures` become the merged ones.
bool finish_parts(TrainRun& r, Outcome& o, nlohmann::json& summary, GpuFigures& figures) {
  try {
    write_run_part(r.run->dir(), part_of(*r.mesh, r.place->rank, o.trained ? &o.result : nullptr));
    if (o.code == kExitOk)
      r.mesh->c10d_world()->store_barrier("parts");
  } catch (const CollectiveTimeout& e) {
    o.code = kExitRankFailure, o.error = one_line(e);
  } catch (const std::exception& e) {
    o.code = kExitFailure, o.error = one_line(e);
  }
  if (!r.leader()) {
    if (o.code != kExitOk)
      r.say(o.error);
    return true;
  }
  if (o.code == kExitOk) {
    try {
      r.parts = read_run_parts(r.run->dir(), r.config.gpus);
      r.merged = merge_run_parts(r.parts);
      if (!r.merged.routing.empty())
        write_routing(r.run->dir(), r.merged.routing, summary);
      write_run_reports(r.run->dir(), r.config, r.merged.recorders, r.merged.samples, summary);
      figures = figures_of(r.parts, r.merged);
    } catch (const std::exception& e) {
      o.code = kExitFailure, o.error = one_line(e);
    }
  }
  return false;
}

// The end of a run: the run folder tidied and written, then the line that says why the run
// ended (after any warning from writing the folder), or the line that says it is done.
int finish_run(TrainRun& r, Outcome& o, nlohmann::json& summary, const GpuFigures& figures) {
  int code = o.code;
  // A write that failed (a full disk) or a stop mid-checkpoint leaves a temporary folder.
  try {
    tidy_checkpoints(r.run->dir());
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: warning: {}\n", one_line(e));
  }
  std::string ending;
  if (const int sig = g_stop_signal.load(); sig != 0 && code == kExitOk) {
    code = kExitSignalBase + sig;
    summary["status"] = "interrupted";
    summary["exit_code"] = code;
    ending = fmt::format("interrupted by signal {} after step {}", sig, o.result.steps);
  } else if (code != kExitOk) {
    summary["status"] = "failed";
    summary["error"] = o.error;
    summary["exit_code"] = code;
    ending = o.error;
  }
  try {
    write_outputs(*r.run, *r.mesh, r.config, summary, figures);
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: could not write the run folder: {}\n", one_line(e));
    if (code == kExitOk) code = kExitFailure;
  }
  if (!ending.empty()) {
    fmt::print(stderr, "\n");
    r.say(ending);
  }
  if (code == kExitOk)
    fmt::print(stderr, "meshsim: done: {} steps, final loss {:.4f}, test accuracy {:.2f}%, {:.1f} s; wrote {}\n",
               summary["steps"].get<int64_t>(), summary["final_loss"].get<double>(),
               100 * summary["test_accuracy"].get<double>(), summary["wall_seconds"].get<double>(),
               r.run->dir().string());
  return code;
}

} // namespace

int run_train(TrainConfig config) {
  try {
    validate(config);
    // A folder that cannot be written fails now, not after the run; whether it may hold files
    // (a resume into its own folder) is decided below, once the checkpoint is verified.
    check_out_folder(config.out, /*may_hold_files=*/true);
  } catch (const std::exception& e) {
    return report_failure(e);
  }
  if (const auto code = refuse_too_large_for_host(config))
    return *code;
  TrainRun r;
  try {
    DataRequest request;
    request.data = config.data;
    request.synthetic_train = config.synthetic_train;
    request.synthetic_test = config.synthetic_test;
    request.shape = config.shape;
    request.seed = config.seed;
    r.data = make_family_data(model_family(config.model), request);
  } catch (const std::exception& e) {
    return report_failure(e);
  }
  r.config = std::move(config);
  if (const auto code = verify_resume(r.config, r.data, r.resume))
    return *code;
  if (const auto code = find_place(r.config, r.place))
    return *code;

  install_accounting_allocator();
  if (const auto code = open_mesh_and_folder(r))
    return *code;
  nlohmann::json summary = announce(r);
  const auto wall_start = std::chrono::steady_clock::now();
  StopSignals signals;
  Outcome outcome = train_into(r, summary);
  summary["wall_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  GpuFigures figures = figures_of(*r.mesh, outcome.trained ? &outcome.result : nullptr);
  if (!r.place)
    return finish_run(r, outcome, summary, figures);
  const bool done = finish_parts(r, outcome, summary, figures); // local writes, and a barrier
  // A failed process of a run of processes ends within kFailedRankTeardown, whatever a peer
  // that is gone or hung leaves its teardown waiting on (exit_within).
  if (outcome.code != kExitOk)
    exit_within(kFailedRankTeardown, outcome.code);
  return done ? outcome.code : finish_run(r, outcome, summary, figures);
}

} // namespace meshsim
