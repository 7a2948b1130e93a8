// Plans: a training step of a configuration run on the meta device, without its data or its
// memory, through the same strategy code that trains for real.
//
// The ranks that differ run: one per pipeline stage (data-parallel and tensor-parallel index
// 0). Every byte they "allocate" is charged to their virtual GPU by the accounting allocator
// exactly as on CPU; collectives record their sizes and move nothing (comm/record_only.h).
// The other GPUs are their images (tp members hold equal shards, replicas are copies). The cost
// model replays the executed ranks only, with each collective costed over its whole group
// (PredictOptions::images): the images would arrive at the same moments, so the step is the
// same as replaying every GPU, which replicate_replicas' records do (the tests hold the two
// equal).
#pragma once

#include <cstdint>
#include <vector>

#include "memory/virtual_gpu.h"
#include "mesh/parallel_dims.h"
#include "mesh/recorder.h"
#include "train/config.h"

namespace meshsim {

/// One executed rank: the first GPU of a pipeline stage, standing for all dp × tp of them.
struct PlannedRank {
  int rank = 0;
  ParallelCoord coord;
  MemoryStats stats;             // peaks by category over the planned steps
  int64_t model_state_bytes = 0; // parameters + gradients + optimizer between steps
};

struct Plan {
  ParallelDims dims;
  std::vector<PlannedRank> ranks;  // the executed ranks, in rank order
  /// Per GPU of the world; only the executed ones hold records (replicate_replicas fills
  /// the others: with many GPUs that is most of a plan's memory, so only a prediction does it).
  std::vector<Recorder> recorders;
  int64_t steps = 0;               // planned steps
  int64_t samples_per_step = 0;    // global batch
  int64_t tokens_per_step = 0;     // global batch × sequence length
};

/// Steps a plan runs. One: it is the step the cost model replays (a recorded run's
/// representative step), and everything a step keeps is allocated before that step's first
/// peak, so later steps change no peak and no model state (PlanImages.LaterStepsChangeNoPeak
/// holds every layout to that).
constexpr int64_t kPlanSteps = 1;

/// Throws std::invalid_argument (one line) for a configuration a plan cannot run: a model
/// whose kernels have no meta version, or DataParallel.
void check_plannable(const TrainConfig& config);

/// Runs `config` (validated) on the meta device with `capacity_bytes` per GPU. Throws
/// std::invalid_argument (one line) for a configuration a plan cannot run (a model whose
/// kernels have no meta version, DataParallel), and OutOfMemory when a GPU goes over capacity.
Plan make_plan(const TrainConfig& config, int64_t capacity_bytes, int64_t steps = kPlanSteps);

/// The records of the executed ranks (dp and tp index 0, every stage) copied to every GPU:
/// rank (0, 0, p) becomes (d, t, p). In a copied group, the coordinates the group spans are
/// kept (a dp group stays that stage's dp group at tp index t, a tp group becomes replica d's
/// tp group, the world stays the world); a pipeline peer becomes (d, t, its stage).
std::vector<Recorder> replicate_replicas(const std::vector<Recorder>& executed,
                                         const ParallelDims& dims);

} // namespace meshsim
