// Pipeline parallelism: where a Sequential model is cut into stages (at the units its parallel
// plan declares), and the one executor
// that runs any schedule (parallel/pipeline/schedule.h) for one rank's stage, passing activations
// forward and their gradients backward with point-to-point send/recv.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "mesh/rank_runner.h"
#include "models/layers/dropout.h"
#include "models/parallel_plan.h"
#include "parallel/strategy.h"
#include "parallel/pipeline/schedule.h"

namespace meshsim {

/// Indices of the children of `model` that form pipeline stage `stage` of `stages`, cut at
/// the model's declared units (plan.pipeline_units, models/parallel_plan.h): each unit starts
/// at its child, the children before the first joining the first unit and those after the
/// last joining the last. Units are split into `stages` contiguous groups as evenly as
/// possible, earlier stages taking the extra one. Throws std::invalid_argument with a one-line
/// message when there are fewer units than stages, when a unit names no child (or not in
/// order), or when stage is not in [0, stages).
std::vector<size_t> stage_children(const torch::nn::Sequential& model, const ParallelPlan& plan,
                                   int stages, int stage);

/// The same with stages of unequal size: stage i takes unit_counts[i] units (Megatron's
/// uneven first and last stage, or any list; config/stage_layers.h). An empty unit_counts is
/// the even cut. Throws std::invalid_argument with a one-line message when unit_counts does
/// not have `stages` entries, one is below 1, or they do not add up to the model's units.
std::vector<size_t> stage_children(const torch::nn::Sequential& model, const ParallelPlan& plan,
                                   int stages, int stage, const std::vector<int64_t>& unit_counts);

/// The same for a model without a plan: if it has children named "block*" the units are
/// those, otherwise a unit is a child with parameters plus the parameter-less children after
/// it (leading parameter-less children join the first). An empty plan.pipeline_units does the
/// same.
std::vector<size_t> stage_children(const torch::nn::Sequential& model, int stages, int stage);

/// A new Sequential sharing those child modules (same names).
torch::nn::Sequential stage_module(const torch::nn::Sequential& model, int stages, int stage);

/// A new Sequential sharing the children of `model` at `indices`, in that order (same names).
torch::nn::Sequential children_module(const torch::nn::Sequential& model,
                                      const std::vector<size_t>& indices);

/// The number of units (see stage_children): the most stages the model can be cut into.
int pipeline_units(const torch::nn::Sequential& model, const ParallelPlan& plan);
int pipeline_units(const torch::nn::Sequential& model);

struct PipelineStage {
  torch::nn::Sequential module; // this rank's stage (its one chunk when `chunks` is empty)
  int stage = 0, stages = 1;
  /// Global ranks of the previous and next stage's counterpart (-1: none). With virtual
  /// stages they wrap around: the first stage's previous is the last stage, and back.
  int prev_rank = -1, next_rank = -1;
  /// Interleaved schedules: the V model chunks this rank runs, chunks[k] being virtual stage
  /// stage + k·stages of stages·V (the Megatron placement). Empty: V = 1, `module`.
  std::vector<torch::nn::Sequential> chunks;
  /// This step's dropout draw of each micro-batch, installed around its forwards (empty: no
  /// dropout; models/layers/dropout.h).
  std::vector<std::shared_ptr<const DropoutDraw>> dropout;
  /// The factor each micro-batch's loss reaches backward with (its share of the local batch
  /// times the loss scale), installed around its forwards for a mixture of experts' balancing
  /// loss (MoeLossScale, models/layers/moe.h); empty: 1.
  std::vector<double> loss_factors;
  /// Megatron-LM's scatter/gather of pipeline messages (Narayanan et al. SC'21 §4.1): the tp
  /// group, every member of which holds the stage's output and its gradient whole. Each sends
  /// its 1/tp of them, over its own link, and the receiving stage's tp ranks all-gather the
  /// parts. Empty: every rank sends the whole tensor.
  Group scatter_gather;
  int virtual_stages() const { return chunks.empty() ? 1 : static_cast<int>(chunks.size()); }
};

/// Tags of the point-to-point messages of micro-batch `m` into the rank's local chunk `chunk`
/// (0 to V-1; the receiver's for activations and gradients alike). They stay clear of the
/// small tags other strategies use, activations never share a tag with gradients, and no two
/// (micro-batch, chunk) pairs share one. With V = 1 they are 2^20 + 2m and 2^20 + 2m + 1.
int pipeline_activation_tag(int micro_batch, int chunk = 0, int virtual_stages = 1);
int pipeline_grad_tag(int micro_batch, int chunk = 0, int virtual_stages = 1);

/// Runs one training step's actions for this rank's stage: forwards and backwards of the
/// micro-batches with activations and their gradients passed by comm.send/recv. `inputs`
/// (first stage) and `targets` (last stage) hold one tensor per micro-batch; other stages may
/// pass empty vectors but must know the micro-batch count from the schedule. With virtual
/// stages, each action runs the chunk of its virtual stage; the first virtual stage (on the
/// first stage) takes the inputs and the last (on the last stage) the targets.
/// The last stage computes loss(output, target) for each micro-batch and backpropagates it
/// scaled by (micro-batch size / local batch size) · loss_scale (fp16's, a power of two), so
/// the accumulated gradients equal those of the mean loss over the local batch (times that
/// scale); the loss's kernels are counted with the micro-batch's forward and backward.
/// Gradients accumulate into the parameters' existing .grad. Returns, on the last stage, the
/// mean loss over the local batch; 0 on other stages.
/// Allocations are charged to `activations`; each micro-batch's saved graph is released right
/// after its backward. Records every F and B with ctx.record_compute ("forward" /
/// "backward") and calls ctx.sample_memory(step, "2F0"-style action text) after each F and B.
/// Throws std::invalid_argument for actions of another stage (or of a chunk it does not hold)
/// or missing inputs/targets.
double run_pipeline_step(
    RankContext& ctx, PipelineStage& stage, const std::vector<Action>& actions,
    const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets,
    const TrainingLoss& loss, int64_t step, double loss_scale = 1.0);

} // namespace meshsim
