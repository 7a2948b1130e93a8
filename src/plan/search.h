// `meshsim plan --search`: the layouts of a model on a cluster, ranked by predicted throughput.
//
// The candidates are every tensor-parallel size within a node (a power of two), every
// pipeline depth that divides the GPUs left, the data-parallel size that fills the cluster,
// ZeRO 3, 1 and 0 (and 2 without a pipeline), HSDP (ZeRO 3 within a node's dp ranks, when a
// node holds more than one and fewer than all of them), micro-batch sizes
// 1, 2, 4 and 8, recompute none, selective and full, and sequence parallelism on and off
// where tp > 1. Pipelines use 1F1B. A candidate that `validate` refuses (the global batch
// does not divide, heads do not split) is rejected with its reason.
//
// Each remaining candidate is estimated without running all of it: its strategy runs as a
// plan (plan/plan.h) with 1 and 2 transformer blocks per stage and 1 and 2 micro-batches,
// and the figures are carried on to the real sizes. Every block has the same shape, so a
// stage's bytes, its FLOPs and its time grow by the same amount per block (linear in blocks
// per stage); one more micro-batch adds to the step what the second one added (a full
// pipeline's steady state), and to a stage's peak what the second one added, once for each
// micro-batch the schedule has that stage hold at once (dry_run's peak_in_flight). So a
// layer of a given shape, precision and micro-batch size is measured once per layout, not
// once per block and micro-batch. Then the best estimates are planned in full and their
// figures replaced by the plan's. Tests hold estimates against full plans
// (SearchEstimate.*).
//
// Memory decides most candidates, and it is monotone: more ZeRO sharding, sequence
// parallelism, a smaller micro-batch and more recompute each hold less. So within a family
// the candidates are taken from the least memory up: full recompute first, and when it does
// not fit, neither does the same layout with less recompute or a larger micro-batch; when the
// most sharded, smallest one does not fit, nothing in the family does. Before any plan, the
// model state alone at the ZeRO paper's bytes per parameter, spread evenly over tp × pp
// (model_state_floor), rejects what cannot fit whatever the activations. When full recompute
// fits, none and then selective are tried and the first that fits is the layout: recomputing
// more never makes a step faster. Micro-batch sizes are tried from 1 up and stop at the first
// that is slower than the size before it: a heuristic (throughput rises with the size while
// larger kernels pay off, then falls as the pipeline bubble grows), not an exhaustive search;
// the sizes not tried are counted as not planned.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cost/hardware.h"
#include "config/config.h"
#include "plan/plan.h"

namespace meshsim {

/// One layout of the search, as planned or estimated.
struct Layout {
  TrainConfig config;  // validated: tp, pp, zero, micro-batches, recompute, sequence parallel
  PlanFigures figures;
  bool confirmed = false; // figures from a full plan, not the extrapolation
  double estimated_step_seconds = 0; // the extrapolation's step, kept when confirmed
};

/// A family of candidates (one tp × pp) that produced no fitting layout, and why.
struct RejectedFamily {
  std::string family;  // "tp 2, pp 3"
  std::string reason;  // "does not divide: ..." or "does not fit: smallest peak 93.1 GiB"
  int candidates = 0;
};

struct SearchOptions {
  int top = 10;     // layouts to report
  int confirm = 3;  // best estimates planned in full
  /// Called after each fitting layout with (layouts estimated, layouts fitting); may be empty.
  std::function<void(int, int)> progress;
};

struct SearchResult {
  std::vector<Layout> best;              // fitting layouts, fastest first, at most `top`
  std::vector<RejectedFamily> rejected;  // families with no fitting layout
  int candidates = 0;  // layouts enumerated
  int invalid = 0;     // refused by validate (do not divide)
  int planned = 0;     // estimated through plans
  int fitting = 0;     // of those, fitting the GPU's memory
};

/// The model state per GPU of `c` (validated) at the ZeRO paper's bytes per parameter
/// (weights and gradients at the precision's width, fp32 optimizer state and master weights,
/// each sharded over dp by its stage), with the parameters split evenly over tp × pp: a lower
/// bound on any GPU's model state (replicated layers and uneven stages only add to it).
int64_t model_state_floor(const TrainConfig& c);

/// The layouts of `base` (model, precision, global batch; its layout flags are ignored) on
/// `cluster`. Throws std::invalid_argument (one line) when `base` has no global batch.
SearchResult search_layouts(const TrainConfig& base, const ClusterSpec& cluster,
                            const SearchOptions& options = {});

/// The figures of `config` on `cluster` extrapolated from plans with 1 and 2 blocks per stage
/// and 1 and 2 micro-batches (see the top of this file). When one micro-batch already peaks
/// above `stop_above` bytes, returns that plan's figures (a lower bound on the memory, its
/// step time not carried on to the real micro-batches).
PlanFigures estimate_layout(const TrainConfig& config, const ClusterSpec& cluster,
                            int64_t stop_above = kPlanCapacity, const PredictOptions& target = {});

} // namespace meshsim
