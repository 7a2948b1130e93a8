// meshsim's command line as data: every subcommand's flags parsed into their arguments, without
// running anything. main() runs what it parsed; the command-line fuzz target parses and
// validates only.
#pragma once

#include <memory>
#include <string>

#include "cli/commands.h"

namespace meshsim {

enum class Command { kNone, kTrain, kPlan, kInfo, kPredict, kModels, kBenchComm, kValidate, kExport, kLaunch, kServe };

struct CommandLine {
  Command command = Command::kNone;
  TrainConfig train;      // train's flags (and --config's file)
  TrainConfig plan;       // plan's flags
  PlanArgs plan_args;
  PredictArgs predict;
  ModelsArgs models;
  BenchCommArgs bench;
  ValidateArgs validate;
  ServeArgs serve;
  ExportArgs export_;
  LaunchArgs launch;
};

/// The subcommands and their flags, made once and bound to line(); parse() may run many times
/// (the command-line fuzz target does), each from the defaults.
class CommandLineParser {
public:
  CommandLineParser();
  ~CommandLineParser();
  /// Parses argv into line(). Returns -1 when a command is ready to run; otherwise the exit
  /// code to end with, the help or the one-line error already printed (--help: 0; a bad flag
  /// or --config file: 2 or 3).
  int parse(int argc, char** argv);
  CommandLine& line() { return line_; }

private:
  struct Apps;
  CommandLine line_;
  std::unique_ptr<Apps> apps_;
};

/// One CommandLineParser's parse of argv into `out`.
int parse_command_line(int argc, char** argv, CommandLine& out);

/// Runs what parse_command_line parsed; returns the exit code.
int run_command_line(CommandLine& line);

/// main()'s work: parses argv, runs it, and maps what no command mapped itself (std::bad_alloc)
/// to its exit code. The tests call it in their own process for the refusals they sweep flag by
/// flag (tests/cli/cli_harness.h), which saves each the start of a process that loads LibTorch.
int run_main(int argc, char** argv);

} // namespace meshsim
