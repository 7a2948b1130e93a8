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
#include "comm/c10d_backend.h"
#include "comm/communicator.h"
#include "data/dataset.h"
#include "data/text.h"
#include "memory/allocator.h"
#include "memory/virtual_gpu.h"
#include "mesh/device_mesh.h"
#include "mesh/parallel_dims.h"
#include "mesh/rank_runner.h"
#include "models/models.h"
#include "models/presets.h"
#include "models/resnet.h"
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
  // The model is built on this host (to count it, then on every rank): a real-size preset is
  // refused before anything is allocated when its float32 weights alone could not fit.
  if (is_transformer(config.model)) {
    const int64_t parameters = preset_parameter_count(config.model, config.shape);
    const int64_t weight_bytes = 4 * parameters;
    const int64_t host = host_memory_for_gpus();
    if (weight_bytes > host) {
      fmt::print(stderr,
                 "meshsim: {} (--layers {}, --hidden {}, --vocab {}) has {} parameters: its "
                 "float32 weights ({}) exceed this machine's {} available; `meshsim plan` "
                 "predicts such a model without building it\n",
                 config.preset.empty() ? config.model : config.preset, config.shape.layers,
                 config.shape.hidden, config.shape.vocab, parameters, format_bytes(weight_bytes),
                 format_bytes(host));
      return kExitUsage;
    }
  }

  // Synthetic data is made on this host before anything trains: refused in one line when it
  // alone would take more than half of what the host can give (a sample count past any tensor
  // included).
  if (config.data == "synthetic") {
    // A sample's bytes as made: images in float32; tokens as int64 inputs and labels.
    const double sample_bytes =
        config.model == "resnet50" ? kImageChannels * kImageSize * kImageSize * 4.0
        : is_transformer(config.model) ? 16.0 * static_cast<double>(config.shape.seq_len)
                                       : kImageSide * kImageSide * 4.0 + 8;
    const double samples =
        static_cast<double>(config.synthetic_train) + static_cast<double>(config.synthetic_test);
    const double host = static_cast<double>(host_memory_for_gpus());
    if (samples * sample_bytes > host / 2) {
      const std::string what = config.model == "resnet50" ? "3×224×224 images"
                               : is_transformer(config.model)
                                   ? fmt::format("sequences of {} tokens", config.shape.seq_len)
                                   : "28×28 images";
      fmt::print(stderr,
                 "meshsim: {:.0f} synthetic {} take {}, more than half of this machine's {} "
                 "available; pass fewer with --synthetic-train ({}) and --synthetic-test ({})\n",
                 samples, what,
                 format_bytes(static_cast<int64_t>(std::min(samples * sample_bytes, 9e18))),
                 format_bytes(static_cast<int64_t>(host)), config.synthetic_train,
                 config.synthetic_test);
      return kExitUsage;
    }
  }

  DataSplit data;
  try {
    if (is_transformer(config.model))
      data = config.data == "synthetic"
                 ? synthetic_text(config.synthetic_train, config.synthetic_test, config.shape.seq_len,
                                  config.shape.vocab, config.seed)
                 : make_text_dataset(config.data, config.shape.seq_len);
    else if (config.model == "resnet50")
      data = synthetic_images(config.synthetic_train, config.synthetic_test, kImageChannels,
                              kImageSize, kImageClasses, config.seed);
    else
      data = config.data == "synthetic"
                 ? synthetic_dataset(config.synthetic_train, config.synthetic_test, config.seed)
                 : load_idx_dataset(config.data);
  } catch (const std::exception& e) {
    return report_failure(e);
  }

  // Everything a resume needs is checked before the run folder is made: the checkpoint's
  // manifest, its layout, every part's checksum, and that a step is left to train.
  std::optional<VerifiedCheckpoint> resume;
  try {
    last_step(config, static_cast<int64_t>(data.train.size()));  // throws for a batch too small
    if (!config.resume.empty()) {
      resume = verify_checkpoint(config.resume, checkpoint_identity(config), config.gpus);
      check_steps_left(config, static_cast<int64_t>(data.train.size()), resume->manifest.step);
    }
  } catch (const std::exception& e) {
    // What is neither the data's nor the host's fault here is the flags': --resume names
    // something that is not a checkpoint of this run.
    Failure f = failure_of(e);
    if (f.code == kExitFailure) f.code = kExitUsage;
    fmt::print(stderr, "meshsim: {}\n", f.message);
    return f.code;
  }

  // --backend c10d: this process is one rank of a run made of processes.
  std::optional<ProcessPlace> place;
  if (config.backend == "c10d") {
    try {
      place = place_from_environment();
    } catch (const std::invalid_argument& e) {
      fmt::print(stderr, "meshsim: {}\n", e.what());
      return kExitUsage;
    }
    if (!place) {
      fmt::print(stderr, "meshsim: --backend c10d runs one rank per process and finds no RANK "
                         "and WORLD_SIZE: start it with `meshsim launch --nproc-per-node N -- "
                         "train ...`, torchrun, mpirun or srun\n");
      return kExitUsage;
    }
  }
  const bool leader = !place || place->rank == 0;  // writes the run folder's shared files
  auto say = [&](const std::string& line) {
    fmt::print(stderr, "meshsim: {}{}\n", place ? fmt::format("rank {}: ", place->rank) : "",
               line);
  };

  install_accounting_allocator();
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
  std::unique_ptr<DeviceMesh> mesh_owner;
  try {
    mesh_owner = std::make_unique<DeviceMesh>(mesh_options);  // c10d: the rendezvous
    if (place)
      check_same_configuration(config, *mesh_owner->c10d_world());
  } catch (const std::exception& e) {
    const Failure f = failure_of(e);
    say(f.message);
    return f.code;
  }
  DeviceMesh& mesh = *mesh_owner;

  std::unique_ptr<RunFolder> run;
  std::string folder_error;
  if (leader) try {
    // A folder that holds something is another run's: never mix two runs' files. Resuming
    // into the folder it resumes keeps its metrics and checkpoints up to the checkpoint.
    if (!config.out.empty() && is_nonempty_folder(config.out)) {
      if (!resume)
        throw std::invalid_argument(fmt::format(
            "--out {} is not empty; choose a new folder, or add --resume to continue the run in it",
            config.out));
      const auto resumed_run =
          std::filesystem::weakly_canonical(resume->folder).parent_path().parent_path();
      if (std::filesystem::weakly_canonical(config.out) != resumed_run)
        throw std::invalid_argument(fmt::format(
            "--out {} is not empty and is not the folder of the run being resumed ({})",
            config.out, resumed_run.string()));
      truncate_metrics(config.out, resume->manifest.step);
      tidy_checkpoints(config.out, resume->manifest.step);
    }
    run = std::make_unique<RunFolder>(config.out);
  } catch (const std::exception& e) {
    folder_error = one_line(e);
  }
  if (place) {
    // The other processes write their checkpoint parts and run parts into rank 0's folder.
    try {
      const std::string shared = mesh.c10d_world()->share(
          "run-folder", run ? run->dir().string() : "!" + folder_error);
      if (!leader && shared.rfind('!', 0) == 0)
        return kExitUsage;  // rank 0 says why
      if (!leader)
        run = std::make_unique<RunFolder>(shared, /*logs=*/false);
    } catch (const CollectiveTimeout& e) {
      say(one_line(e));
      return kExitRankFailure;
    } catch (const std::exception& e) {
      say(one_line(e));
      return kExitUsage;
    }
  }
  if (!folder_error.empty()) {
    say(folder_error);
    return kExitUsage;
  }
  if (leader) {
    nlohmann::json config_json = to_json(config);
    config_json["out"] = run->dir().string();
    run->write_json("config.json", config_json);
  }

  const ParallelDims dims = ParallelDims::make(config.gpus, config.tp, config.pp);
  ModelOptions model_options;
  model_options.shape = config.shape;
  const int64_t parameters = count_parameters(*build_model(config.model, model_options));
  const std::string layout =
      uses_mesh_layout(config)
          ? fmt::format(" as {}{}, zero {}{}, {} micro-batches, recompute {}", dims.describe(),
                        config.sequence_parallel ? " with sequence parallel" : "", config.zero,
                        dims.pp > 1
                            ? ", " + config.schedule + " schedule" +
                                  (config.virtual_stages > 1
                                       ? fmt::format(" ({} virtual stages)", config.virtual_stages)
                                       : "")
                            : "",
                        config.micro_batches, config.recompute)
          : "";
  if (leader)
  fmt::print(stderr,
             "meshsim: {} on {} {}{} ({} each, {} device, {} threads per rank), model {} "
             "({} parameters), data {} ({} train / {} test), run folder {}\n",
             config.strategy, config.gpus,
             !place ? "virtual GPUs"
             : config.device == "cpu" ? "processes (--backend c10d, Gloo)"
                                      : "processes (--backend c10d, NCCL)", layout,
             format_bytes(mesh.gpu(0).capacity()), config.device,
             threads_per_rank(config.gpus * mesh.processes_per_host() /
                              static_cast<int>(mesh.local_ranks().size())),
             config.preset.empty() ? config.model
                                   : config.model + " (preset " + config.preset + ")",
             parameters, config.data, data.train.size(), data.test.size(), run->dir().string());

  nlohmann::json summary = {{"world_size", config.gpus},
                            {"strategy", config.strategy},
                            {"layout", {{"dp", dims.dp}, {"tp", dims.tp}, {"pp", dims.pp},
                                        {"zero", config.zero}, {"schedule", config.schedule},
                                        {"virtual_stages", config.virtual_stages},
                                        {"micro_batches", config.micro_batches},
                                        {"recompute", config.recompute},
                                        {"sequence_parallel", config.sequence_parallel}}},
                            {"model", config.model},
                            {"parameters", parameters},
                            {"device", config.device},
                            {"batch_size", config.batch_size},
                            {"global_batch_size", config.batch_size * dims.dp},
                            {"backend", config.backend}};
  const auto wall_start = std::chrono::steady_clock::now();
  auto wall = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  };
  int code = kExitOk;
  std::string error;
  StopSignals signals;
  TrainResult result;
  bool trained = false;
  try {
    result = train(config, mesh, data, run.get(), &g_stop_signal, std::move(resume));
    trained = true;
    summary["status"] = "ok";
    summary["steps"] = result.steps;
    summary["final_loss"] = std::isfinite(result.final_loss) ? nlohmann::json(result.final_loss)
                                                              : nlohmann::json(nullptr);
    summary["test_accuracy"] = result.test_accuracy;
    summary["test_samples"] = result.test_samples;
    summary["train_seconds"] = result.train_seconds;
    summary["collectives"] = collectives_json(result.recorders);
    if (result.stopped == StopReason::Diverged) {
      code = kExitDiverged, error = result.stop_message;
      summary.erase("test_accuracy");
      summary.erase("test_samples");
    } else {
      if (result.stopped == StopReason::Signal) summary.erase("test_accuracy");
      if (result.stopped == StopReason::Signal) summary.erase("test_samples");
      if (!place)  // a run of processes writes them from every process's part, below
        write_run_reports(run->dir(), config, result.recorders, mesh.timeline().samples(),
                          summary);
    }
  } catch (const std::exception& e) {
    const Failure f = failure_of(e);
    code = f.code, error = f.message;
  }
  summary["wall_seconds"] = wall();
  GpuFigures figures = figures_of(mesh, trained ? &result : nullptr);
  std::vector<RunPart> parts;
  MergedRun merged;
  if (place) {
    // Every process writes its rank's part; once all have (a run that went well), rank 0
    // merges them into the files a simulated run writes.
    try {
      write_run_part(run->dir(), part_of(mesh, place->rank, trained ? &result : nullptr));
      if (code == kExitOk)
        mesh.c10d_world()->store_barrier("parts");
    } catch (const CollectiveTimeout& e) {
      code = kExitRankFailure, error = one_line(e);
    } catch (const std::exception& e) {
      code = kExitFailure, error = one_line(e);
    }
    if (!leader) {
      if (code != kExitOk)
        say(error);
      return code;
    }
    if (code == kExitOk) {
      try {
        parts = read_run_parts(run->dir(), config.gpus);
        merged = merge_run_parts(parts);
        write_run_reports(run->dir(), config, merged.recorders, merged.samples, summary);
        figures = figures_of(parts, merged);
      } catch (const std::exception& e) {
        code = kExitFailure, error = one_line(e);
      }
    }
  }
  // A write that failed (a full disk) or a stop mid-checkpoint leaves a temporary folder.
  try {
    tidy_checkpoints(run->dir());
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: warning: {}\n", one_line(e));
  }
  // The line that says why the run ended comes last, after any warning from writing the
  // run folder.
  std::string ending;
  if (const int sig = g_stop_signal.load(); sig != 0 && code == kExitOk) {
    code = kExitSignalBase + sig;
    summary["status"] = "interrupted";
    summary["exit_code"] = code;
    ending = fmt::format("interrupted by signal {} after step {}", sig, result.steps);
  } else if (code != kExitOk) {
    summary["status"] = "failed";
    summary["error"] = error;
    summary["exit_code"] = code;
    ending = error;
  }
  try {
    write_outputs(*run, mesh, config, summary, figures);
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: could not write the run folder: {}\n", one_line(e));
    if (code == kExitOk) code = kExitFailure;
  }
  if (!ending.empty()) {
    fmt::print(stderr, "\n");
    say(ending);
  }
  if (code == kExitOk)
    fmt::print(stderr, "meshsim: done: {} steps, final loss {:.4f}, test accuracy {:.2f}%, {:.1f} s; wrote {}\n",
               summary["steps"].get<int64_t>(), summary["final_loss"].get<double>(),
               100 * summary["test_accuracy"].get<double>(), summary["wall_seconds"].get<double>(),
               run->dir().string());
  return code;
}

} // namespace meshsim
