// meshsim's command line: `meshsim train` runs a simulation and writes its run folder;
// `meshsim plan` answers the same question for a target cluster without running it;
// `meshsim info` says what this build can do; `meshsim models` lists the model presets;
// `meshsim export` writes a run's trained model as a PyTorch state_dict; `meshsim launch`
// starts the processes of a run with --backend c10d.
//
// Exit codes: 0 ok, 2 usage or configuration, 3 data, 4 a virtual GPU ran out of memory,
// 5 a collective timed out or a rank failed, 1 anything else.
#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <torch/version.h>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"meshsim: multi-GPU distributed training on virtual GPUs"};
  app.require_subcommand(1);
  meshsim::TrainConfig config;
  auto* train = app.add_subcommand("train", "train a model on N virtual GPUs");
  config.device = "auto"; // the command line trains on the GPU when there is one
  meshsim::add_train_flags(*train, config);
  // The file is read before parsing so that the flags given override it; the option is
  // registered only so that CLI11 accepts it.
  std::string config_path;
  train->add_option("--config", config_path,
                    "start from this config.json (a run folder's); flags given override it");
  const std::string config_file = meshsim::find_config_arg(argc, argv);
  if (!config_file.empty()) {
    std::string error;
    if (!meshsim::load_config_file(config_file, config, &error)) {
      std::fprintf(stderr, "meshsim: %s\n", error.c_str());
      return meshsim::kExitUsage;
    }
  }
  const double file_lr = config.optimizer.lr;
  meshsim::TrainConfig plan_config;
  meshsim::PlanArgs plan_args;
  auto* plan = app.add_subcommand("plan", "plan a run on a target cluster without running it");
  meshsim::add_plan_flags(*plan, plan_config, plan_args);
  auto* info = app.add_subcommand("info", "show this build's LibTorch, CUDA path, GPU, NVML's view of the card and threads");
  meshsim::PredictArgs predict_args;
  auto* predict = app.add_subcommand("predict", "re-predict a recorded run on a target cluster");
  meshsim::add_predict_flags(*predict, predict_args);
  meshsim::ModelsArgs models_args;
  auto* models = app.add_subcommand("models", "list the model presets with their parameter counts");
  meshsim::add_models_flags(*models, models_args);
  meshsim::BenchCommArgs bench_args;
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* bench_comm = bench->add_subcommand("comm", "collective bandwidth: cost model vs in-process");
  meshsim::add_bench_comm_flags(*bench_comm, bench_args);
  meshsim::ExportArgs export_args;
  auto* export_ = app.add_subcommand(
      "export", "write a run's trained model as a PyTorch state_dict (--state-dict FILE)");
  meshsim::add_export_flags(*export_, export_args);
  meshsim::LaunchArgs launch_args;
  auto* launch = app.add_subcommand(
      "launch", "start this node's processes of a run with --backend c10d: launch "
                "--nproc-per-node N -- train --backend c10d ...");
  meshsim::add_launch_flags(*launch, launch_args);
  meshsim::ValidateArgs validate_args;
  auto* validate = app.add_subcommand(
      "validate", "hold the cost model against every published measurement it knows");
  meshsim::add_validate_flags(*validate, validate_args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::fprintf(stderr, "meshsim: %s (see meshsim %s --help)\n", what.c_str(),
                 train->parsed()     ? "train"
                 : plan->parsed()    ? "plan"
                 : export_->parsed() ? "export"
                                     : "");
    return meshsim::kExitUsage;
  }
  // add_train_flags sets sgd's default learning rate when --lr is absent; the file's own
  // learning rate wins unless the command line changed the optimizer.
  if (!config_file.empty() && train->count("--lr") == 0 && train->count("--optimizer") == 0)
    config.optimizer.lr = file_lr;
  if (info->parsed()) return meshsim::run_info();
  if (plan->parsed()) {
    plan_args.gpus_given = plan->count("--gpus") > 0;
    return meshsim::run_plan(plan_config, plan_args);
  }
  if (predict->parsed()) return meshsim::run_predict(predict_args);
  if (models->parsed()) return meshsim::run_models(models_args);
  if (bench_comm->parsed()) return meshsim::run_bench_comm(bench_args);
  if (validate->parsed()) return meshsim::run_validate(validate_args);
  if (export_->parsed()) return meshsim::run_export(export_args);
  if (launch->parsed()) return meshsim::run_launch(launch_args);
  return meshsim::run_train(config);
}
