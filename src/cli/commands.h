// The subcommands behind main(): flags, validation, and the mapping of failures to exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <vector>

#include "comm/recorder.h"
#include "cost/hardware.h"
#include "memory/timeline.h"
#include "config/config.h"

namespace meshsim {

enum ExitCode {
  kExitOk = 0,
  kExitFailure = 1,
  kExitUsage = 2,
  kExitData = 3,
  kExitOutOfMemory = 4,
  kExitRankFailure = 5,
  kExitDiverged = 6,      // the loss stopped being finite
  kExitSignalBase = 128,  // stopped by signal N: 128 + N (130 Ctrl-C, 143 SIGTERM)
};

/// An exception's message up to its first line break (LibTorch's carry a backtrace), with
/// control characters and stray bytes as \xNN (failure.cpp).
std::string one_line(const std::exception& e);

/// What a command's failure means: the exit code (README's "Exit codes") and the line to print.
struct Failure {
  int code = kExitFailure;
  std::string message;
};
Failure failure_of(const std::exception& e);
/// Prints "meshsim: PREFIX MESSAGE" for `e` and returns its exit code.
int report_failure(const std::exception& e, const std::string& prefix = "");
/// Once a process of a run of processes has failed, what it still does (its part of the run
/// folder, then the teardown of its process groups and store clients) may wait on a peer that
/// is gone or hung, inside Gloo's or the store's code, which meshsim cannot interrupt. From
/// this call on, the process exits with `code` (stderr flushed, no destructors) if it has not
/// exited by itself within `limit`, so that `meshsim launch` hears of the failure.
void exit_within(std::chrono::milliseconds limit, int code);

void add_train_flags(CLI::App& app, TrainConfig& config);
int run_train(TrainConfig config);
int run_info();

/// `meshsim predict RUN_DIR --cluster SPEC` (predict_command.cpp).
struct PredictArgs {
  std::string run_dir, cluster, intra, inter;
  std::string dtype = "fp32";
  int gpus = 0;      // > 0: replay a data-parallel run on this many GPUs
  int64_t step = -1; // -1: the representative step
  bool measured_compute = false;
  bool no_overlap = false;
};
void add_predict_flags(CLI::App& app, PredictArgs& args);
int run_predict(const PredictArgs& args);

/// End of `meshsim train`: records.json, trace.json and, with --cluster, summary["prediction"].
/// Failures are warnings: the run's own results are already safe.
void write_run_reports(const std::filesystem::path& dir, const TrainConfig& config,
                       const std::vector<Recorder>& recorders,
                       const std::vector<MemorySample>& memory, nlohmann::json& summary);

/// `meshsim plan`: train's flags (TrainConfig) plus these.
struct PlanArgs {
  bool json = false;       // one JSON object on stdout instead of the table
  bool search = false;     // --search: rank the layouts instead of planning the one given
  int top = 10;            // --top: layouts --search prints
  bool gpus_given = false; // --gpus on the command line (else: the cluster's GPUs)
  std::string moe_routing = "balanced"; // a mixture of experts' routing (plan/moe_routing.h)
  double moe_imbalance = 0;             // --moe-imbalance F; 0: not given
};
void add_plan_flags(CLI::App& app, TrainConfig& config, PlanArgs& args);
int run_plan(TrainConfig config, const PlanArgs& args);
/// Plans `config` (validated) on `cluster` and returns plan.json's document; with config.out,
/// writes plan.json, trace.json, memory.png and plan.html there (plan_command.cpp); `search`,
/// when not null, is the --search document whose fastest layout `config` is (plan.html shows
/// its table).
nlohmann::json plan_and_write(const TrainConfig& config, const ClusterSpec& cluster,
                              const nlohmann::json& search = nullptr);
/// `--out DIR` checked before any work: refused (std::invalid_argument, one line naming it)
/// when it is a file, cannot be made or written, or holds files and `may_hold_files` is false.
/// An empty `out` passes.
void check_out_folder(const std::string& out, bool may_hold_files);
/// A plan's "layout" object: dp, tp, pp, zero, sequence_parallel, micro_batches,
/// micro_batch_size, recompute of a validated configuration (plan.json, --search's rows).
nlohmann::json layout_json(const TrainConfig& config);
/// `meshsim plan --search` (search_command.cpp), called by run_plan with the cluster parsed;
/// throws as run_plan's body does.
int run_search(const TrainConfig& config, const ClusterSpec& cluster, const PlanArgs& args);

/// 124439808 -> "124.4M", 174615846912 -> "174.6B": the rounding the papers use.
std::string short_count(int64_t n);

/// `meshsim models [--json]` (models_command.cpp): the model presets and their sizes.
struct ModelsArgs {
  bool json = false;
};
void add_models_flags(CLI::App& app, ModelsArgs& args);
int run_models(const ModelsArgs& args);

/// `meshsim bench comm --cluster SPEC` (bench_command.cpp).
struct BenchCommArgs {
  std::string cluster, intra, inter;
  int gpus = 0;                    // in-process ranks measured (default: the cluster's, at most 8)
  int64_t min_bytes = 1024;
  int64_t max_bytes = 64 << 20;
  int iters = 5;
  bool measure = true;             // --model-only: the model's columns alone
  std::string algorithm = "auto";  // all_reduce: auto | ring | tree | nvls
};
void add_bench_comm_flags(CLI::App& app, BenchCommArgs& args);
int run_bench_comm(const BenchCommArgs& args);

/// `meshsim serve` (serve_command.cpp): the planner as a local web page (serve/server.h).
struct ServeArgs {
  std::string host = "127.0.0.1";
  int64_t port = 8080;
  double max_seconds = 60;
  int64_t max_plans = 2;
  int64_t max_waiting = 8;
  int64_t max_body_bytes = 1 << 20;
};
void add_serve_flags(CLI::App& app, ServeArgs& args);
int run_serve(const ServeArgs& args);

/// `meshsim validate`: the published rows the cost model is held against (plan/validation.h).
struct ValidateArgs {
  std::vector<std::string> only;  // --only nccl,narayanan
  std::vector<std::string> family; // --family dense,fp8
  bool json = false;
  double matmul_efficiency = 0;    // > 0: try this large-GEMM efficiency
  double hopper_efficiency = 0;    // > 0: try this large-GEMM efficiency on Hopper
  double fp8_efficiency = 0;       // > 0: try this FP8 large-GEMM efficiency
  double gemm_half_us = -1;        // >= 0: and this GEMM half-efficiency time
  bool progress = true;
};
void add_validate_flags(CLI::App& app, ValidateArgs& args);
int run_validate(const ValidateArgs& args);

/// `meshsim launch --nproc-per-node N [...] -- train ...` (launch_command.cpp): this node's
/// processes of a run with --backend c10d.
struct LaunchArgs {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double grace_s = 30;                // after the first failure, before the others are killed
  std::vector<std::string> command;  // meshsim's own arguments, e.g. train --backend c10d ...
};
void add_launch_flags(CLI::App& app, LaunchArgs& args);
int run_launch(const LaunchArgs& args);

/// `meshsim export RUN_DIR [--state-dict FILE] [--hf DIR]` (export_command.cpp): the run's
/// latest checkpoint as a PyTorch state_dict, and/or as a Hugging Face folder (gpt, llama).
struct ExportArgs {
  std::string run_dir, state_dict, hf;
};
void add_export_flags(CLI::App& app, ExportArgs& args);
int run_export(const ExportArgs& args);

} // namespace meshsim

namespace meshsim {

/// The FILE of `--config FILE` or `--config=FILE` in argv (the last one given), or "".
std::string find_config_arg(int argc, char** argv);

/// Reads a config.json (config_from_json) into `config`. Throws, in one line naming the file,
/// std::invalid_argument when it does not exist, is not JSON (a key twice included) or has an
/// unknown or mistyped key; DataError when it is not a regular file of a config's size.
void load_config_file(const std::string& path, TrainConfig& config);

} // namespace meshsim
