// The routing a plan assumes for a mixture of experts. Meta tensors have no values, so a plan
// cannot route; it gives each expert a share of every layer's assignments instead, the same
// share on every rank (MoeShape::planned_shares):
//
//   --moe-routing balanced   (the default) k·N/E assignments per expert;
//   --moe-imbalance F        expert 0 of every layer takes F times the mean, the others the
//                            rest in equal parts;
//   --moe-routing RUN_DIR    a recorded run's busiest step (routing.csv, report/routing.h):
//                            the step and layer whose busiest expert took the most over the
//                            mean, its experts' shares sorted busiest first and rescaled to
//                            the plan's E experts.
//
// Expert 0 is the busiest, held by the first rank of every ep group, which is the rank a plan
// runs: every rank is planned as the hottest, and the step waits on the hottest rank anyway.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshsim {

struct PlannedRouting {
  std::vector<double> shares;  // per expert, summing to 1, busiest first; empty: balanced
  std::string description;     // one line: what the plan assumed
  double hottest = 1;          // the busiest expert's share over the mean
};

/// The routing `--moe-routing routing` and `--moe-imbalance imbalance` (0: not given) ask for,
/// for layers of `experts` experts. std::invalid_argument (one line) for an imbalance outside
/// [1, experts], given with a run folder, or a folder without routing.csv; DataError for a
/// routing.csv that cannot be read or is not well formed.
PlannedRouting planned_routing(const std::string& routing, double imbalance, int64_t experts);

/// A recorded run's busiest step, from routing.csv's text (`name` in messages), rescaled to
/// `experts` experts. DataError (one line naming the file and line) for text that is not
/// routing.csv's: another header, a field that is not a non-negative integer, an expert past
/// the run's, or no rows.
PlannedRouting routing_from_csv(const std::string& text, const std::string& name, int64_t experts);

} // namespace meshsim
