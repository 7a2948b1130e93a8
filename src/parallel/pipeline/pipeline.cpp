// Pipeline parallelism: cutting a Sequential into stages, and the executor that runs one
// stage's list of actions. The executor knows nothing about the schedule that produced the
// list: it runs each action in order, and a recv simply waits for its neighbour's send.
#include "parallel/pipeline/pipeline.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "memory/allocator.h"
#include "models/layers/flops.h"
#include "models/layers/moe.h"
#include "parallel/replica.h"

namespace meshsim {
namespace {

// Where each unit starts (child indices, ascending); unit i ends where unit i+1 starts.
// Without declared units: the children named "block*", else the children with parameters.
std::vector<size_t> unit_starts(const torch::nn::Sequential& model,
                                const std::vector<std::string>& units) {
  const auto children = model->named_children();
  std::vector<size_t> starts;
  if (!units.empty()) {
    size_t next = 0; // the declared units, found in order
    for (const std::string& unit : units) {
      while (next < children.size() && children[next].key() != unit)
        ++next;
      if (next == children.size())
        throw std::invalid_argument("pipeline: the model has no child '" + unit +
                                    "' (in its plan's order) to start a unit at");
      starts.push_back(next++);
    }
  } else {
    std::vector<size_t> blocks, with_params;
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].key().rfind("block", 0) == 0)
        blocks.push_back(i);
      if (!children[i].value()->parameters().empty())
        with_params.push_back(i);
    }
    // Transformer blocks are the natural cut points: embed joins the first block and the
    // final norm and head the last, so the stages stay near equal.
    starts = blocks.empty() ? with_params : blocks;
  }
  if (!starts.empty())
    starts[0] = 0; // leading children join the first unit
  return starts;
}

// Stage `stage`'s units [first, end) of `count`: unit_counts[i] each, or as evenly as can be.
std::pair<int, int> stage_unit_range(int count, int stages, int stage,
                                     const std::vector<int64_t>& unit_counts) {
  if (unit_counts.empty()) {
    const int base = count / stages, extra = count % stages;
    const int first = stage * base + std::min(stage, extra);
    return {first, first + base + (stage < extra ? 1 : 0)};
  }
  if (static_cast<int>(unit_counts.size()) != stages)
    throw std::invalid_argument("pipeline: " + std::to_string(unit_counts.size()) +
                                " stage sizes for " + std::to_string(stages) + " stages");
  int64_t first = 0, total = 0;
  for (size_t i = 0; i < unit_counts.size(); ++i) {
    if (unit_counts[i] < 1)
      throw std::invalid_argument("pipeline: stage " + std::to_string(i) + " would hold " +
                                  std::to_string(unit_counts[i]) + " units: every stage needs one");
    if (static_cast<int>(i) < stage) first += unit_counts[i];
    total += unit_counts[i];
  }
  if (total != count)
    throw std::invalid_argument("pipeline: the stage sizes add up to " + std::to_string(total) +
                                " units, the model has " + std::to_string(count));
  return {static_cast<int>(first), static_cast<int>(first + unit_counts[static_cast<size_t>(stage)])};
}

std::vector<size_t> stage_children_at(const torch::nn::Sequential& model,
                                      const std::vector<std::string>& units, int stages,
                                      int stage, const std::vector<int64_t>& unit_counts = {}) {
  if (stages < 1 || stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline stage " + std::to_string(stage) + " is not in [0, " +
                                std::to_string(stages) + ")");
  const std::vector<size_t> starts = unit_starts(model, units);
  const int count = static_cast<int>(starts.size());
  if (count < stages)
    throw std::invalid_argument("cannot cut the model into " + std::to_string(stages) +
                                " pipeline stages: it has only " + std::to_string(count) +
                                " units (layers with parameters, or transformer blocks)");
  const auto [first_unit, end_unit] = stage_unit_range(count, stages, stage, unit_counts);
  const size_t begin = starts[first_unit];
  const size_t end = end_unit < count ? starts[end_unit] : model->size();
  std::vector<size_t> out;
  for (size_t i = begin; i < end; ++i)
    out.push_back(i);
  return out;
}

// Messages of micro-batch m into local chunk k: activations on even tags, gradients on odd.
constexpr int kPipelineTagBase = 1 << 20;

// Everything one micro-batch holds between its actions on this stage.
struct MicroBatch {
  torch::Tensor input;         // received activation (a leaf that requires grad); stage > 0
  torch::Tensor output;        // stage output, still attached to its graph; not the last stage
  torch::Tensor loss;          // last stage: this micro-batch's loss, attached to its graph
  torch::Tensor output_grad;   // gradient of `output`, received from the next stage
  torch::Tensor input_grad;    // gradient of `input`, to send to the previous stage
  std::vector<LayerWork> work; // its forward's FLOPs and bytes, per layer (for the cost model)
  LayerWork loss_backward;     // the last chunk's: its loss's backward kernels
};

void check_stage(const PipelineStage& stage, const std::vector<Action>& actions) {
  if (stage.stages < 1 || stage.stage < 0 || stage.stage >= stage.stages)
    throw std::invalid_argument("pipeline stage " + std::to_string(stage.stage) +
                                " is not in [0, " + std::to_string(stage.stages) + ")");
  // With virtual stages every rank has chunks on both sides of it (the ring wraps).
  const bool chunked = stage.virtual_stages() > 1;
  if ((stage.stage > 0 || chunked) && stage.prev_rank < 0)
    throw std::invalid_argument("pipeline stage " + std::to_string(stage.stage) +
                                " has no prev_rank");
  if ((stage.stage < stage.stages - 1 || chunked) && stage.next_rank < 0)
    throw std::invalid_argument("pipeline stage " + std::to_string(stage.stage) +
                                " has no next_rank");
  const int chunks = stage.stages * stage.virtual_stages();
  for (const auto& a : actions)
    if (a.stage < 0 || a.stage >= chunks || a.stage % stage.stages != stage.stage)
      throw std::invalid_argument("pipeline stage " + std::to_string(stage.stage) +
                                  " was given action " + a.str());
}

} // namespace

int pipeline_units(const torch::nn::Sequential& model, const ParallelPlan& plan) {
  return static_cast<int>(unit_starts(model, plan.pipeline_units).size());
}

int pipeline_units(const torch::nn::Sequential& model) {
  return static_cast<int>(unit_starts(model, {}).size());
}

int pipeline_activation_tag(int micro_batch, int chunk, int virtual_stages) {
  return kPipelineTagBase + 2 * (micro_batch * virtual_stages + chunk);
}
int pipeline_grad_tag(int micro_batch, int chunk, int virtual_stages) {
  return pipeline_activation_tag(micro_batch, chunk, virtual_stages) + 1;
}

std::vector<size_t> stage_children(const torch::nn::Sequential& model, const ParallelPlan& plan,
                                   int stages, int stage) {
  return stage_children_at(model, plan.pipeline_units, stages, stage);
}

std::vector<size_t> stage_children(const torch::nn::Sequential& model, const ParallelPlan& plan,
                                   int stages, int stage, const std::vector<int64_t>& unit_counts) {
  return stage_children_at(model, plan.pipeline_units, stages, stage, unit_counts);
}

std::vector<size_t> stage_children(const torch::nn::Sequential& model, int stages, int stage) {
  return stage_children_at(model, {}, stages, stage);
}

torch::nn::Sequential stage_module(const torch::nn::Sequential& model, int stages, int stage) {
  return children_module(model, stage_children(model, stages, stage));
}

torch::nn::Sequential children_module(const torch::nn::Sequential& model,
                                      const std::vector<size_t>& indices) {
  torch::nn::Sequential whole = model; // shares the module; gives non-const access
  const auto children = whole->named_children();
  torch::nn::Sequential out;
  for (size_t i : indices)
    out->push_back(children[i].key(), *(whole->begin() + static_cast<std::ptrdiff_t>(i)));
  return out;
}

namespace {

// A message to another stage: whole, or with scatter/gather this rank's 1/tp of its last
// dimension (the hidden size, which tensor parallelism divides), every tp rank holding the
// same tensor.
void send_to_stage(RankContext& ctx, const PipelineStage& stage, const torch::Tensor& t, int dst,
                   int tag) {
  const int n = stage.scatter_gather.size();
  if (n <= 1) {
    ctx.comm.send(t, dst, tag);
    return;
  }
  const int64_t i = stage.scatter_gather.index_of(ctx.rank);
  ctx.comm.send(t.chunk(n, -1)[static_cast<size_t>(i)].contiguous(), dst, tag);
}

// The matching receive: with scatter/gather, the tp ranks' parts all-gathered and joined.
torch::Tensor recv_from_stage(RankContext& ctx, const PipelineStage& stage, int src, int tag) {
  torch::Tensor part = ctx.comm.recv(src, tag);
  if (stage.scatter_gather.size() <= 1)
    return part;
  const torch::Tensor parts = ctx.comm.all_gather(part, stage.scatter_gather);
  return torch::cat(parts.unbind(0), -1);
}

} // namespace

double run_pipeline_step(
    RankContext& ctx, PipelineStage& stage, const std::vector<Action>& actions,
    const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets,
    const TrainingLoss& loss, int64_t step, double loss_scale) {
  check_stage(stage, actions);
  const int V = stage.virtual_stages(), P = stage.stages, chunks = P * V;
  // This rank holds the model's first chunk (the inputs) or its last (the targets).
  const bool has_inputs = stage.stage == 0, has_targets = stage.stage == P - 1;
  int micro_batches = 0;
  for (const auto& a : actions)
    micro_batches = std::max(micro_batches, a.micro_batch + 1);
  if (has_inputs && static_cast<int>(inputs.size()) < micro_batches)
    throw std::invalid_argument("the first pipeline stage needs " + std::to_string(micro_batches) +
                                " input micro-batches, got " + std::to_string(inputs.size()));
  if (has_targets && static_cast<int>(targets.size()) < micro_batches)
    throw std::invalid_argument("the last pipeline stage needs " + std::to_string(micro_batches) +
                                " target micro-batches, got " + std::to_string(targets.size()));
  int64_t local_batch = 0;
  if (has_targets)
    for (int m = 0; m < micro_batches; ++m)
      local_batch += targets[m].size(0);

  CategoryScope scope(MemoryCategory::Activations);
  auto module_of = [&](int k) -> torch::nn::Sequential& {
    return V == 1 ? stage.module : stage.chunks[static_cast<size_t>(k)];
  };
  for (int k = 0; k < V; ++k)
    module_of(k)->train();
  // One per (local chunk, micro-batch): chunk k's micro-batch m at k·M + m.
  std::vector<MicroBatch> mbs(static_cast<size_t>(V) * micro_batches);
  double loss_sum = 0; // sum over micro-batches of mean loss * size
  for (const Action& a : actions) {
    const int m = a.micro_batch, k = a.stage / P; // the chunk's index on this rank
    const bool first = a.stage == 0, last = a.stage == chunks - 1;
    MicroBatch& mb = mbs[static_cast<size_t>(k) * micro_batches + m];
    switch (a.kind) {
    case ActionKind::RecvActivation:
      mb.input = recv_from_stage(ctx, stage, stage.prev_rank, pipeline_activation_tag(m, k, V));
      // A leaf, so backward leaves the gradient to send back in input.grad().
      if (mb.input.is_floating_point())
        mb.input.requires_grad_(true);
      break;
    case ActionKind::Forward: {
      const DropoutScope dropout(static_cast<size_t>(m) < stage.dropout.size()
                                     ? stage.dropout[static_cast<size_t>(m)]
                                     : nullptr);
      const MoeLossScale aux(static_cast<size_t>(m) < stage.loss_factors.size()
                                 ? stage.loss_factors[static_cast<size_t>(m)]
                                 : 1.0);
      const auto t = ctx.mark();
      torch::Tensor out = forward_counting(module_of(k), first ? inputs[m] : mb.input, mb.work);
      std::vector<LayerWork> work = mb.work;
      if (last) {
        mb.loss = loss(out, targets[m]);
        loss_sum += loss_value(mb.loss) * static_cast<double>(targets[m].size(0));
        const LossWork counted = loss.work(out);
        work.push_back(counted.forward);
        mb.loss_backward = counted.backward;
      } else {
        mb.output = out;
      }
      ctx.record_compute("forward", step, t);
      attach_work(ctx.recorder.compute.back(), std::move(work));
      ctx.sample_memory(step, a.str());
      break;
    }
    case ActionKind::SendActivation:
      if (!mb.output.defined())
        throw std::invalid_argument("pipeline action " + a.str() + " before its forward");
      // Into the next virtual stage, the next rank's chunk (a.stage + 1) / P.
      send_to_stage(ctx, stage, mb.output.detach(), stage.next_rank,
                    pipeline_activation_tag(m, (a.stage + 1) / P, V));
      break;
    case ActionKind::RecvGrad:
      mb.output_grad = recv_from_stage(ctx, stage, stage.next_rank, pipeline_grad_tag(m, k, V));
      break;
    case ActionKind::Backward: {
      const auto t = ctx.mark();
      if (last) {
        if (!mb.loss.defined())
          throw std::invalid_argument("pipeline action " + a.str() + " before its forward");
        // Each micro-batch's loss is a mean over its own samples; weighting it by its share
        // of the local batch makes the summed gradients those of the local batch's mean.
        const double share =
            static_cast<double>(targets[m].size(0)) / static_cast<double>(local_batch);
        (mb.loss * (share * loss_scale)).backward();
      } else {
        if (!mb.output.defined() || !mb.output_grad.defined())
          throw std::invalid_argument("pipeline action " + a.str() +
                                      " before its forward or its gradient");
        mb.output.backward(mb.output_grad);
      }
      if (!first && mb.input.defined()) {
        mb.input_grad = mb.input.grad();
        if (!mb.input_grad.defined())
          mb.input_grad = torch::zeros_like(mb.input);
      }
      // The graph was freed by backward; dropping these frees what it saved.
      mb.input = mb.output = mb.loss = mb.output_grad = torch::Tensor();
      ctx.record_compute("backward", step, t);
      attach_work(ctx.recorder.compute.back(), last ? backward_work(mb.work, mb.loss_backward)
                                                    : backward_work(mb.work));
      mb.work.clear();
      ctx.sample_memory(step, a.str());
      break;
    }
    case ActionKind::SendGrad:
      if (!mb.input_grad.defined())
        throw std::invalid_argument("pipeline action " + a.str() + " before its backward");
      // Back to the previous virtual stage, the previous rank's chunk (a.stage - 1) / P.
      send_to_stage(ctx, stage, mb.input_grad, stage.prev_rank,
                    pipeline_grad_tag(m, (a.stage - 1) / P, V));
      mb.input_grad = torch::Tensor();
      break;
    }
  }
  return has_targets && local_batch > 0 ? loss_sum / static_cast<double>(local_batch) : 0.0;
}

} // namespace meshsim
