// parse_command_line(): the subcommands and their flags (CLI11), and the mapping of a parse
// error to exit code 2.
#include "cli/command_line.h"

#include <CLI/CLI.hpp>

#include "base/printable.h"

namespace meshsim {

struct CommandLineParser::Apps {
  CLI::App app{"meshsim: multi-GPU distributed training on virtual GPUs"};
  CLI::App *train, *plan, *info, *predict, *models, *bench, *bench_comm, *export_, *launch,
      *validate, *serve;
  std::string config_path; // registered only so that CLI11 accepts --config (read before)
};

CommandLineParser::CommandLineParser() : apps_(std::make_unique<Apps>()) {
  Apps& a = *apps_;
  CommandLine& out = line_;
  a.app.require_subcommand(1);
  a.train = a.app.add_subcommand("train", "train a model on N virtual GPUs");
  add_train_flags(*a.train, out.train);
  a.train->add_option("--config", a.config_path,
                      "start from this config.json (a run folder's); flags given override it");
  a.plan = a.app.add_subcommand("plan", "plan a run on a target cluster without running it");
  add_plan_flags(*a.plan, out.plan, out.plan_args);
  a.info = a.app.add_subcommand(
      "info", "show this build's LibTorch, CUDA path, GPU, NVML's view of the card and threads");
  a.predict = a.app.add_subcommand("predict", "re-predict a recorded run on a target cluster");
  add_predict_flags(*a.predict, out.predict);
  a.models = a.app.add_subcommand("models", "list the model presets with their parameter counts");
  add_models_flags(*a.models, out.models);
  a.bench = a.app.add_subcommand("bench", "benchmarks");
  a.bench->require_subcommand(1);
  a.bench_comm = a.bench->add_subcommand("comm", "collective bandwidth: cost model vs in-process");
  add_bench_comm_flags(*a.bench_comm, out.bench);
  a.export_ = a.app.add_subcommand(
      "export", "write a run's trained model as a PyTorch state_dict (--state-dict FILE)");
  add_export_flags(*a.export_, out.export_);
  a.launch = a.app.add_subcommand(
      "launch", "start this node's processes of a run with --backend c10d: launch "
                "--nproc-per-node N -- train --backend c10d ...");
  add_launch_flags(*a.launch, out.launch);
  a.validate = a.app.add_subcommand(
      "validate", "hold the cost model against every published measurement it knows");
  add_validate_flags(*a.validate, out.validate);
  a.serve = a.app.add_subcommand(
      "serve", "the planner as a local web page: pick a model, a cluster and a layout, or search");
  add_serve_flags(*a.serve, out.serve);
}

CommandLineParser::~CommandLineParser() = default;

int CommandLineParser::parse(int argc, char** argv) {
  Apps& a = *apps_;
  CommandLine& out = line_;
  static const CommandLine defaults;
  out = defaults; // a parse before this one leaves nothing behind
  a.app.clear();
  TrainConfig& config = out.train;
  config.device = "auto"; // the command line trains on the GPU when there is one
  // The file is read before parsing so that the flags given override it.
  const std::string config_file = find_config_arg(argc, argv);
  if (!config_file.empty()) {
    try {
      load_config_file(config_file, config);
    } catch (const std::exception& e) {
      return report_failure(e);
    }
  }
  const double file_lr = config.optimizer.lr;
  try {
    a.app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return a.app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return a.app.exit(e);
  } catch (const CLI::ParseError& e) {
    // The help of the deepest subcommand parsed so far ("meshsim bench comm --help"), or the
    // top level's before any.
    std::string help = "meshsim";
    for (const CLI::App* at = &a.app; !at->get_subcommands().empty();) {
      at = at->get_subcommands().front();
      help += " " + at->get_name();
    }
    std::fprintf(stderr, "meshsim: %s (see %s --help)\n", printable(e.what()).c_str(),
                 help.c_str());
    return kExitUsage;
  } catch (const std::exception& e) {
    // A file a flag names, read while the flags are applied (--hf-config): its own exit code.
    return report_failure(e);
  }
  // add_train_flags sets sgd's default learning rate when --lr is absent; the file's own
  // learning rate wins unless the command line changed the optimizer.
  if (!config_file.empty() && a.train->count("--lr") == 0 && a.train->count("--optimizer") == 0)
    config.optimizer.lr = file_lr;
  out.plan_args.gpus_given = a.plan->count("--gpus") > 0;
  out.command = a.info->parsed()         ? Command::kInfo
                : a.plan->parsed()       ? Command::kPlan
                : a.predict->parsed()    ? Command::kPredict
                : a.models->parsed()     ? Command::kModels
                : a.bench_comm->parsed() ? Command::kBenchComm
                : a.validate->parsed()   ? Command::kValidate
                : a.serve->parsed()      ? Command::kServe
                : a.export_->parsed()    ? Command::kExport
                : a.launch->parsed()     ? Command::kLaunch
                                         : Command::kTrain;
  return -1;
}

int parse_command_line(int argc, char** argv, CommandLine& out) {
  CommandLineParser parser;
  const int code = parser.parse(argc, argv);
  out = parser.line();
  return code;
}

int run_main(int argc, char** argv) {
  CommandLine line;
  if (const int code = parse_command_line(argc, argv, line); code >= 0)
    return code;
  try {
    return run_command_line(line);
  } catch (const std::exception& e) {
    return report_failure(e); // what a command did not map itself (std::bad_alloc)
  }
}

int run_command_line(CommandLine& line) {
  switch (line.command) {
  case Command::kInfo: return run_info();
  case Command::kPlan: return run_plan(line.plan, line.plan_args);
  case Command::kPredict: return run_predict(line.predict);
  case Command::kModels: return run_models(line.models);
  case Command::kBenchComm: return run_bench_comm(line.bench);
  case Command::kValidate: return run_validate(line.validate);
  case Command::kExport: return run_export(line.export_);
  case Command::kLaunch: return run_launch(line.launch);
  case Command::kTrain: return run_train(line.train);
  case Command::kServe: return run_serve(line.serve);
  case Command::kNone: break;
  }
  return kExitUsage;
}

} // namespace meshsim
