// One step's micro-batches in the mesh engine (parallel/hybrid.cpp): the replica's batch split
// into them, run through this rank's stage (in turn, or by the pipeline schedule) with the
// loss counted beside each, and their dropout draws.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "mesh/parallel_dims.h"
#include "mesh/rank_runner.h"
#include "models/layers/dropout.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/strategy.h"
#include "parallel/tensor/tensor_parallel.h"

namespace meshsim {
namespace mesh_engine {

/// Exactly M micro-batches of the replica's batch (sizes differ by one at most; the trainer
/// drops a last batch smaller than M), each weighted by its size in the loss. Opens the step's
/// record: the cost model's step window starts at a rank's first compute region, which must
/// come before a later stage's first recv.
void split_micro_batches(RankContext& ctx, const Batch& batch, torch::Dtype dtype, int M,
                         int64_t step, std::vector<torch::Tensor>& inputs,
                         std::vector<torch::Tensor>& targets);

/// The step's forwards and backwards: the pipeline schedule's actions, or with one stage the
/// micro-batches in turn, each loss computed by `loss` and counted with its micro-batch. fp16:
/// every backward starts from the loss times `scale` (a power of two, so the loss reported is
/// divided back exactly). Returns the local mean loss.
double forward_backward(RankContext& ctx, PipelineStage& pipe, const std::vector<Action>& actions,
                        const TrainingLoss& loss, const std::vector<torch::Tensor>& inputs,
                        const std::vector<torch::Tensor>& targets, int64_t local_batch,
                        int64_t step, double scale);

/// The step's dropout draw of each of the M micro-batches (models/layers/dropout.h): their
/// rows' indices in the global batch, and the whole-sequence positions of the tokens this
/// rank's residual stream holds: under context parallelism its two chunks (cp_positions),
/// under sequence parallelism tp member i's part of those, [i·T'/t, (i+1)·T'/t) of the T'
/// the rank holds.
std::vector<std::shared_ptr<const DropoutDraw>> micro_batch_draws(
    const StrategyOptions& options, const ParallelDims& dims, const ParallelCoord& coord,
    const Batch& batch, const std::vector<torch::Tensor>& inputs, int M, int64_t step);

/// While a step trains: a head split over the vocabulary leaves its logits split
/// (VocabParallelHead::parallel_output), for the vocab-parallel loss; whole again after.
class SplitLogits {
public:
  explicit SplitLogits(VocabParallelHeadImpl* head) : head_(head) {
    if (head_) head_->parallel_output = true;
  }
  ~SplitLogits() {
    if (head_) head_->parallel_output = false;
  }
  SplitLogits(const SplitLogits&) = delete;
  SplitLogits& operator=(const SplitLogits&) = delete;

private:
  VocabParallelHeadImpl* head_;
};

} // namespace mesh_engine
} // namespace meshsim
