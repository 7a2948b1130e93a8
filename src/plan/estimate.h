// estimate_layout: a layout's figures carried on from plans of a few blocks and micro-batches.
//
// Each remaining candidate is estimated without running all of it: its strategy runs as a
// plan (plan/plan.h) with 1 and 2 transformer blocks per stage and 1 and 2 micro-batches,
// and the figures are carried on to the real sizes. Every block has the same shape, so a
// stage's bytes, its FLOPs and its time grow by the same amount per block (linear in blocks
// per stage); one more micro-batch adds to the step what the second one added (a full
// pipeline's steady state), and to a stage's peak what the second one added, once for each
// micro-batch the schedule has that stage hold at once (dry_run's peak_in_flight). So a
// layer of a given shape, precision and micro-batch size is measured once per layout, not
// once per block and micro-batch. Tests hold estimates against full plans
// (SearchEstimate.*).
#pragma once

#include <cstdint>

#include "cost/hardware.h"
#include "cost/predict.h"
#include "config/config.h"
#include "plan/plan.h"

namespace meshsim {

/// The figures of `config` on `cluster` extrapolated from plans with 1 and 2 blocks per stage
/// and 1 and 2 micro-batches (see the top of this file). When one micro-batch already peaks
/// above `stop_above` bytes, returns that plan's figures (a lower bound on the memory, its
/// step time not carried on to the real micro-batches).
PlanFigures estimate_layout(const TrainConfig& config, const ClusterSpec& cluster,
                            int64_t stop_above = kPlanCapacity, const PredictOptions& target = {});

/// The model state per GPU of `c` (validated) at the ZeRO paper's bytes per parameter
/// (weights and gradients at the precision's width, fp32 optimizer state and master weights,
/// each sharded over dp by its stage), with the parameters split evenly over tp × pp: a lower
/// bound on any GPU's model state (replicated layers and uneven stages only add to it).
int64_t model_state_floor(const TrainConfig& c);

} // namespace meshsim
