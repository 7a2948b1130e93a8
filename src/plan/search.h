// `meshsim plan --search`: the layouts of a model on a cluster, ranked by predicted throughput.
//
// The candidates are every tensor-parallel size within a node (a power of two); for a
// transformer, every context-parallel size (a power of two) that leaves each rank at least
// 2,048 tokens of the sequence, with the all-gather and the ring exchange; every pipeline depth
// that divides the GPUs left; the data-parallel size that fills the cluster; ZeRO 3, 2, 1 and
// 0, and HSDP (ZeRO 3 within a node's dp ranks, when a node holds more than one and fewer
// than all of them); micro-batch sizes 1, 2, 4 and 8; recompute none, selective and full;
// and sequence parallelism on and off where tp > 1. The attention core is the base
// configuration's (--attention). Pipelines use 1F1B. A candidate that `validate` refuses (the
// global batch does not divide, heads do not split) is rejected with its reason. Families
// (one tp × cp × pp) are searched at once on as many threads as the machine has.
//
// Each remaining candidate is estimated from plans of 1 and 2 blocks per stage and 1 and 2
// micro-batches (plan/estimate.h); then the best estimates are planned in full and their
// figures replaced by the plan's.
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
#include "plan/estimate.h"
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
  /// Called from the threads searching families, one call at a time.
  std::function<void(int, int)> progress;
  /// Families searched at once, each on its own thread (0: one per hardware thread).
  int workers = 0;
};

struct SearchResult {
  std::vector<Layout> best;              // fitting layouts, fastest first, at most `top`
  std::vector<RejectedFamily> rejected;  // families with no fitting layout
  int candidates = 0;  // layouts enumerated
  int invalid = 0;     // refused by validate (do not divide)
  int planned = 0;     // estimated through plans
  int fitting = 0;     // of those, fitting the GPU's memory
  /// tp × cp × pp families searched with the ring only: at their gate it fit and was at
  /// least as fast as the all-gather (search.cpp, choose_exchanges).
  int allgather_skipped = 0;
};

/// The layouts of `base` (model, precision, global batch; its layout flags are ignored) on
/// `cluster`. Throws std::invalid_argument (one line) when `base` has no global batch.
SearchResult search_layouts(const TrainConfig& base, const ClusterSpec& cluster,
                            const SearchOptions& options = {});

} // namespace meshsim
