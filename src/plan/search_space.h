// The space `meshsim plan --search` walks (search.h): its families (one tp × cp × pp and the
// context-parallel exchange), each family's candidates and ZeRO shardings, and the exchange
// chosen per family before the search. Internal to plan/search.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "cost/hardware.h"
#include "plan/plan.h"

namespace meshsim::search {

/// A family of the search: one tp × cp × pp (and the context-parallel exchange), and for a
/// mixture of experts its ep.
struct FamilyShape {
  int tp = 1, cp = 1, pp = 1;
  std::string cp_comm = "allgather";
  int ep = 1;
  /// The estimate of the family's gate (gate_candidate), where choosing the exchange made it.
  std::optional<PlanFigures> gate;
};

/// How a candidate shards ZeRO's state: its stage, and HSDP's shard groups (0: all of dp).
struct Sharding {
  int zero = 0;
  int dp_shard = 0;
};

/// "tp 4 cp 16 (ring) pp 4 dp 4 zero 1 mbs 1 recompute none sp", and "tp 4, cp 16 (ring), pp 4".
std::string describe(const TrainConfig& c);
std::string describe(const FamilyShape& f);

/// `base` laid out as one candidate of the search (validate() still to run).
TrainConfig candidate(const TrainConfig& base, int world, const FamilyShape& shape,
                      Sharding sharding, bool sp, int64_t micro_batch_size, const char* recompute);

/// The family's first candidate, the one that holds the least: ZeRO 3 over all of dp × cp,
/// sequence parallelism where tp > 1, one sample per micro-batch, full recompute.
TrainConfig gate_candidate(const TrainConfig& base, int world, const FamilyShape& shape);

/// The families, in order (search_space.cpp says which): every tp within a node (tp 1 alone
/// under --no-loss-upcast), cp and pp that divide; for a mixture of experts, each of them
/// with every power-of-two ep that divides the experts and dp × cp.
std::vector<FamilyShape> family_shapes(const TrainConfig& base, const ClusterSpec& cluster);

/// A family's ZeRO shardings, from the most to the least.
std::vector<Sharding> family_shardings(const FamilyShape& shape, int world, int gpus_per_node);

/// `shapes` without the all-gather families whose ring twin fit and was at least as fast at
/// their gate, each gate estimated on `workers` threads; `skipped` counts those left out.
std::vector<FamilyShape> choose_exchanges(const TrainConfig& base, const ClusterSpec& cluster,
                                          std::vector<FamilyShape> shapes, int64_t memory,
                                          int workers, int& skipped);

} // namespace meshsim::search
