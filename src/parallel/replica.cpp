// The phases shared by every strategy.
#include "parallel/replica.h"

#include "models/layers/dropout.h"
#include "models/layers/flops.h"
#include "models/layers/moe.h"
#include "memory/allocator.h"
#include "models/gpt.h"
#include "models/models.h"
#include "parallel/data/zero.h"
#include "parallel/tensor/tensor_parallel.h"

namespace meshsim {

Replica::Replica(const StrategyOptions& options, int rank, bool with_optimizer) {
  {
    CategoryScope scope(MemoryCategory::Parameters);
    ModelOptions model_options;
    model_options.seed = options.seed;
    seed = options.seed;
    dropout = options.shape.dropout;
    loss_upcast = options.loss_upcast;
    model_options.rank = rank;
    model_options.shape = options.shape;
    model_options.attention = options.attention;
    model_options.eager_elementwise = options.eager_elementwise;
    dtype = compute_dtype(options);
    ensure_kernels_for(dtype);
    model_options.dtype = dtype;
    model_options.device = options.device;
    model_options.initial = options.initial;
    model = build_model(options.model, model_options);
  }
  params = model->parameters();
  allocate_gradients(params);
  if (with_optimizer) optimizer = std::make_unique<Optimizer>(params, options.optimizer);
}

namespace {

// The forward work of `module` (counted in `w`) that its backward runs again: a checkpointed
// block's whole forward (--recompute full), all of it but what it keeps (op), or its
// attention core's (selective).
void count_recompute(const torch::nn::Module& module, LayerWork& w) {
  // The block itself, or the block a wrapper holds (ZeRO 3 wraps each one).
  std::vector<const torch::nn::Module*> modules{&module};
  for (const auto& m : module.modules(/*include_self=*/false))
    modules.push_back(m.get());
  bool block = false, keeps = false, core = false;
  for (const torch::nn::Module* m : modules) {
    if (const auto* b = dynamic_cast<const CheckpointedBlock*>(m)) {
      block = block || b->recompute;
      keeps = keeps || b->keep_matmuls;
    }
    if (const auto* a = dynamic_cast<const CheckpointedAttention*>(m))
      core = core || a->recompute_core;
  }
  // Added to what the counts already rerun: a fused attention core's scores (flops.h).
  if (block && keeps) {
    w.keeps_matmuls = true; // backward_work runs again all but what it keeps (flops.h)
  } else if (block) {
    w.rerun_flops += w.flops;
    w.rerun_bytes += w.bytes;
  } else if (core) {
    w.rerun_flops += w.attention_flops;
    w.rerun_bytes += w.attention_bytes;
  }
}

} // namespace

torch::Tensor forward_counting(torch::nn::Sequential& model, torch::Tensor x,
                               std::vector<LayerWork>& layers) {
  const auto children = model->named_children();
  size_t i = 0;
  for (auto& child : *model) {
    torch::Tensor y = child.forward<torch::Tensor>(x);
    const torch::nn::Module& module = unwrapped(*children[i].value()); // the layer, not ZeRO's

    // Activations move at the width they are computed in (token ids are not activations).
    const double elem_bytes = y.is_floating_point() ? static_cast<double>(y.element_size()) : 4;
    layers.push_back(count_layer(children[i].key(), module, x.sizes(), y.sizes(), elem_bytes,
                                 sequence_parts(module)));
    count_recompute(module, layers.back());
    x = std::move(y);
    ++i;
  }
  return x;
}

double Replica::forward_backward(RankContext& ctx, const Batch& batch, int64_t step) {
  CategoryScope scope(MemoryCategory::Activations);
  model->train();
  ctx.sample_memory(step, "batch");
  std::shared_ptr<DropoutDraw> draw;
  if (dropout > 0) {
    draw = std::make_shared<DropoutDraw>();
    draw->seed = seed;
    draw->step = step;
    draw->samples = batch_samples(batch, ctx.rank);
  }
  const DropoutScope dropout_scope(draw);
  const double scale = optimizer ? optimizer->loss_scale() : 1.0;
  const MoeLossScale moe_scale(scale); // a mixture of experts' balancing loss is scaled alike
  auto t = ctx.mark();
  std::vector<LayerWork> layers;
  torch::Tensor x = forward_counting(model, model_inputs(batch.inputs, dtype), layers);
  const TrainingLoss loss_of(loss_upcast); // whole logits: no tensor parallelism here
  torch::Tensor loss = loss_of(x, batch.targets);
  const LossWork counted = loss_of.work(x);
  x = torch::Tensor();
  ctx.record_compute("forward", step, t);
  std::vector<LayerWork> forward = layers;
  forward.push_back(counted.forward);
  attach_work(ctx.recorder.compute.back(), std::move(forward));
  ctx.sample_memory(step, "forward");
  t = ctx.mark();
  if (scale != 1.0)
    (loss * scale).backward();
  else
    loss.backward();
  ctx.record_compute("backward", step, t);
  attach_work(ctx.recorder.compute.back(), backward_work(layers, counted.backward));
  const double value = loss_value(loss);
  loss = torch::Tensor();
  ctx.sample_memory(step, "backward");
  return value;
}

void Replica::optimizer_step(RankContext& ctx, int64_t step, bool grads_finite) {
  const auto t = ctx.mark();
  optimizer->step(grads_finite);
  ctx.record_compute("optimizer", step, t);
  int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const auto& o = optimizer->options();
  attach_work(ctx.recorder.compute.back(),
              {optimizer_work(numel, o.name, o.momentum != 0, static_cast<int64_t>(params.size()))});
  ctx.sample_memory(step, "optimizer");
}

bool gradients_finite(RankContext& ctx, const Optimizer& optimizer, const Group& group) {
  if (!optimizer.loss_scaling())
    return true;
  torch::NoGradGuard no_grad;
  CategoryScope scope(MemoryCategory::Communication);
  const torch::Tensor& like = optimizer.params().front();
  torch::Tensor overflow =
      torch::full({1}, optimizer.grads_finite() ? 0.0 : 1.0, like.options().dtype(torch::kFloat32));
  ctx.comm.all_reduce(overflow, ReduceOp::Max, group);
  if (overflow.is_meta())
    return true; // a plan assumes finite gradients
  return overflow.item<float>() == 0.0f;
}

} // namespace meshsim
