// A mixture of experts' routing as a run recorded it: after every step, for every rank and
// every MoE layer, the assignments its tokens sent to each expert (after capacity) and the
// rows each expert it holds ran (from every rank of its ep group). The run folder keeps all of
// it in routing.csv; summary.json and report.html keep what a person reads: tokens per expert
// over the run, each step's imbalance (the hottest expert's tokens over the mean), and each
// rank's load beside its memory peak (docs/moe.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshsim {

struct RoutingRecord {
  int64_t step = 0;
  int rank = 0;
  int64_t layer = 0;           // the block's index in the model
  int64_t first_expert = 0;    // the first expert the rank holds (ran[0]'s)
  std::vector<int64_t> routed; // [E]: this rank's tokens' assignments to each expert
  std::vector<int64_t> ran;    // [experts held]: rows each held expert ran
};

/// routing.csv: a header, then `step,rank,layer,expert,routed,ran` for every expert of every
/// record (ran empty for an expert the rank does not hold), in step, rank, layer order.
std::string routing_csv(std::vector<RoutingRecord> records);

/// What summary.json's "routing" holds (null for no records): "experts", "layers", "steps";
/// "tokens_per_expert" (per layer, [E] summed over the run and the ranks), "imbalance" (per
/// layer, per step: the most assignments any expert got over the mean), "ranks" (per rank:
/// the rows its experts ran over the run and in its busiest step, summed over layers, and
/// which experts it held).
nlohmann::json routing_summary(const std::vector<RoutingRecord>& records);

} // namespace meshsim
