// One step's micro-batches in the mesh engine. See micro_batches.h.
#include "parallel/micro_batches.h"

#include <fmt/format.h>

#include "memory/allocator.h"
#include "models/layers/flops.h"
#include "models/layers/moe.h"
#include "parallel/context/context_parallel.h"
#include "parallel/replica.h"

namespace meshsim {
namespace mesh_engine {
namespace {

/// One pipeline stage: forward and backward of each micro-batch in turn, gradients summed;
/// every backward starts from the loss times `scale` (fp16). Returns the local mean loss.
double accumulate_micro_batches(RankContext& ctx, const PipelineStage& pipe,
                                const TrainingLoss& loss_of,
                                const std::vector<torch::Tensor>& inputs,
                                const std::vector<torch::Tensor>& targets, int64_t local_batch,
                                int64_t step, double scale) {
  torch::nn::Sequential model = pipe.module;
  model->train();
  double loss_sum = 0;
  for (size_t m = 0; m < inputs.size(); ++m) {
    const DropoutScope dropout(m < pipe.dropout.size() ? pipe.dropout[m] : nullptr);
    const double weight = static_cast<double>(inputs[m].size(0)) / static_cast<double>(local_batch);
    const MoeLossScale aux(weight * scale); // what the micro-batch's loss reaches backward with
    auto t = ctx.mark();
    std::vector<LayerWork> work;
    torch::Tensor out = forward_counting(model, inputs[m], work);
    const LossWork counted = loss_of.work(out);
    torch::Tensor loss = loss_of(out, targets[m]) * weight;
    out = torch::Tensor(); // what backward needs of the logits, the loss's graph keeps
    ctx.record_compute("forward", step, t);
    std::vector<LayerWork> forward = work;
    forward.push_back(counted.forward);
    attach_work(ctx.recorder.compute.back(), std::move(forward));
    ctx.sample_memory(step, fmt::format("F{}", m));
    t = ctx.mark();
    if (scale != 1.0) (loss * scale).backward();
    else loss.backward();
    ctx.record_compute("backward", step, t);
    attach_work(ctx.recorder.compute.back(), backward_work(work, counted.backward));
    loss_sum += loss_value(loss);
    loss = torch::Tensor();
    ctx.sample_memory(step, fmt::format("B{}", m));
  }
  return loss_sum;
}

} // namespace

void split_micro_batches(RankContext& ctx, const Batch& batch, torch::Dtype dtype, int M,
                         int64_t step, std::vector<torch::Tensor>& inputs,
                         std::vector<torch::Tensor>& targets) {
  const auto t = ctx.mark();
  if (batch.size() > 0) {
    inputs = model_inputs(batch.inputs, dtype).tensor_split(M);
    targets = batch.targets.tensor_split(M);
  }
  ctx.record_compute("micro-batches", step, t);
  LayerWork views;  // tensor_split() makes views: no work on a target
  views.layer = "split";
  views.op = "elementwise";
  attach_work(ctx.recorder.compute.back(), {views});
}

double forward_backward(RankContext& ctx, PipelineStage& pipe, const std::vector<Action>& actions,
                        const TrainingLoss& loss, const std::vector<torch::Tensor>& inputs,
                        const std::vector<torch::Tensor>& targets, int64_t local_batch,
                        int64_t step, double scale) {
  if (pipe.stages == 1)
    return accumulate_micro_batches(ctx, pipe, loss, inputs, targets, local_batch, step, scale);
  return run_pipeline_step(ctx, pipe, actions, inputs, targets, loss, step, scale);
}

std::vector<std::shared_ptr<const DropoutDraw>> micro_batch_draws(
    const StrategyOptions& options, const ParallelDims& dims, const ParallelCoord& coord,
    const Batch& batch, const std::vector<torch::Tensor>& inputs, int M, int64_t step) {
  if (!(options.shape.dropout > 0)) return {};
  GpuGuard host(nullptr);  // indices, read by kernels as arguments
  const std::vector<torch::Tensor> samples = batch_samples(batch, coord.dp).tensor_split(M);
  std::vector<std::shared_ptr<const DropoutDraw>> draws;
  for (int m = 0; m < M; ++m) {
    auto draw = std::make_shared<DropoutDraw>();
    draw->seed = options.seed;
    draw->step = step;
    draw->samples = samples[static_cast<size_t>(m)];
    const bool sequence_split = options.sequence_parallel && dims.tp > 1;
    if (dims.cp > 1 || sequence_split) { // else undefined: the tokens 0..T-1
      const int64_t T = static_cast<size_t>(m) < inputs.size()
                            ? inputs[static_cast<size_t>(m)].size(1)
                            : options.shape.seq_len / dims.cp;
      draw->positions = dims.cp > 1 ? cp_positions(T * dims.cp, dims.cp, coord.cp, torch::kLong)
                                    : torch::arange(T, torch::kLong);
      if (sequence_split)
        draw->positions = draw->positions.narrow(0, coord.tp * (T / dims.tp), T / dims.tp);
    }
    draws.push_back(std::move(draw));
  }
  return draws;
}

} // namespace mesh_engine
} // namespace meshsim
