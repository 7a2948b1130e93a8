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

#include <array>
#include <cstdint>
#include <vector>

#include "comm/recorder.h"
#include "cost/hardware.h"
#include "cost/predict.h"
#include "memory/category.h"
#include "memory/timeline.h"
#include "memory/virtual_gpu.h"
#include "mesh/device_mesh.h"
#include "mesh/parallel_dims.h"
#include "config/config.h"

namespace meshsim {

/// One executed rank: the first GPU of a pipeline stage, standing for all dp × tp of them.
struct PlannedRank {
  int rank = 0;
  ParallelCoord coord;
  MemoryStats stats;             // peaks by category over the planned steps
  int64_t model_state_bytes = 0; // parameters + gradients + optimizer between steps
  /// The peaks between its memory samples (DeviceMesh::close_window), construction first:
  /// `stats`' peaks are the largest of them.
  std::vector<PeakWindow> windows;
  /// -1 for a rank the plan ran; else the rank it is an image of (a middle pipeline stage,
  /// plan/stage_images.h), whose figures and records it holds moved to its own stage.
  int image_of = -1;
};

struct Plan {
  ParallelDims dims;
  std::vector<PlannedRank> ranks;  // one per stage (executed, or an image), in rank order
  /// Per GPU of the world; only the executed ones hold records (replicate_replicas fills
  /// the others: with many GPUs that is most of a plan's memory, so only a prediction does it).
  std::vector<Recorder> recorders;
  /// Each stage's live bytes over the step (MemorySample::bytes and by_category: one per entry
  /// of `ranks`, an image's those of the rank it is an image of): memory.csv and memory.png.
  std::vector<MemorySample> timeline;
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

/// The work a plan would do, bounded from the sizes before anything is built: the GPU it
/// executes for each stage builds that stage's blocks (at most kMaxPlannedBlocksPerStage) and
/// runs each of them once per micro-batch (at most kMaxPlannedBlockPasses in all: layers ×
/// micro-batches × steps). Throws std::invalid_argument naming the flags.
void check_plan_work(const TrainConfig& config, int64_t steps);
constexpr int64_t kMaxPlannedBlocksPerStage = 1024;
constexpr int64_t kMaxPlannedBlockPasses = int64_t{1} << 21;

/// What make_plan may leave out: both are for speed, and neither changes a figure it reports.
struct PlanRunOptions {
  /// Run a middle pipeline stage once where the others are its images (plan/stage_images.h);
  /// false runs every stage (tests compare the two).
  bool stage_images = true;
  /// Keep the memory timeline (Plan::timeline: the plan's memory.csv and memory.png), one
  /// column per pipeline stage: a search's thousands of plans keep none.
  bool timeline = true;
  /// GPUs a node of the cluster planned for: expert parallelism exchanges tokens across its
  /// nodes (StrategyOptions::node_size). 0: config.cluster's, or one node.
  int node_size = 0;
};

/// Runs `config` (validated) on the meta device with `capacity_bytes` per GPU. Throws
/// std::invalid_argument (one line) for a configuration a plan cannot run (a model whose
/// kernels have no meta version, DataParallel), and OutOfMemory when a GPU goes over capacity.
Plan make_plan(const TrainConfig& config, int64_t capacity_bytes, int64_t steps = kPlanSteps,
               const PlanRunOptions& run = {});

/// One pipeline stage's memory, or one tp rank's where the stage's tp ranks differ.
struct StageFigures {
  int stage = 0;
  int tp_rank = -1;  // -1: every tp rank of the stage alike
  int64_t peak_bytes = 0;
  int64_t model_state_bytes = 0;
  CategoryBytes peak_by_category{};
  std::vector<PeakWindow> windows; // the executed GPU's (PlannedRank::windows)
};

/// What a plan reports: memory per stage and the step predicted on a cluster.
struct PlanFigures {
  std::vector<StageFigures> stages;
  int world = 0;
  int64_t tokens_per_step = 0;
  double step_seconds = 0;
  double flops = 0;        // counted FLOPs of the step, every GPU, recomputation included
  double model_flops = 0;  // of them, the model's
  double peak_flops = 0;   // one GPU's dense peak at the plan's precision
  int64_t gpu_memory_bytes = 0;
  // Derived from the above by derive_rates() and fits_memory().
  double tokens_per_s_per_gpu = 0;
  double tflops_per_gpu = 0;  // counted FLOPs (recomputation included) per GPU per second
  double mfu = 0;             // model FLOPs per GPU per second ÷ the peak
  int64_t peak_bytes = 0;     // the largest GPU's peak
  bool fits = false;
};

/// Fills `f`'s tokens/s, TFLOP/s, MFU, peak and fit from its other fields.
void derive_rates(PlanFigures& f);

/// Throws std::invalid_argument (one line) when `gpu` cannot run `precision`: fp8 on a GPU
/// without FP8 tensor cores.
void check_precision_on(const std::string& precision, const GpuSpec& gpu);

/// `plan`'s figures with `prediction`, its step replayed on `cluster` at `precision` (MFU
/// against that precision's peak: fp8's for an FP8 plan, as Megatron-Bridge reports it).
PlanFigures plan_figures(const Plan& plan, const Prediction& prediction,
                         const ClusterSpec& cluster, const std::string& precision);

/// make_plan(config) and its prediction on `cluster` (replaying the executed GPUs as images of
/// the others). `prediction`, when given, receives the prediction (its timeline: trace.json),
/// and `plan` the plan. `target` carries what the target runs differently (efficiencies, an
/// unfused attention); its dtype and images are the plan's own.
PlanFigures plan_on(const TrainConfig& config, const ClusterSpec& cluster,
                    Prediction* prediction = nullptr, Plan* plan = nullptr,
                    const PredictOptions& target = {});

/// Samples per micro-batch of a validated configuration: its replica's batch ÷ micro-batches.
inline int64_t micro_batch_size_of(const TrainConfig& c) { return c.batch_size / c.micro_batches; }

/// Far above any GPU: a plan reports whether it fits instead of stopping at the first byte over.
constexpr int64_t kPlanCapacity = int64_t{1} << 60;

/// The records of the executed ranks (dp and tp index 0, every stage) copied to every GPU:
/// rank (0, 0, p) becomes (d, t, p). In a copied group, the coordinates the group spans are
/// kept (a dp group stays that stage's dp group at tp index t, a tp group becomes replica d's
/// tp group, the world stays the world); a pipeline peer becomes (d, t, its stage).
std::vector<Recorder> replicate_replicas(const std::vector<Recorder>& executed,
                                         const ParallelDims& dims);

} // namespace meshsim
