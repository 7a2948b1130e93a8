// The subcommands behind main(): flags, validation, and the mapping of failures to exit codes.
#pragma once

#include <CLI/CLI.hpp>

#include "train/config.h"

namespace meshsim {

enum ExitCode {
  kExitOk = 0,
  kExitFailure = 1,
  kExitUsage = 2,
  kExitData = 3,
  kExitOutOfMemory = 4,
  kExitRankFailure = 5,
};

void add_train_flags(CLI::App& app, TrainConfig& config);
int run_train(TrainConfig config);
int run_info();

} // namespace meshsim
