// What the strategies need from a run's configuration.
#pragma once

#include "config/config.h"
#include "parallel/strategy.h"

namespace meshsim {

/// What the strategies need from `config` (model, layout, optimizer).
StrategyOptions strategy_options(const TrainConfig& config);

} // namespace meshsim
