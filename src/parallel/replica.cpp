// The phases shared by every strategy.
#include "parallel/replica.h"

#include "cost/flops.h"
#include "memory/allocator.h"
#include "models/models.h"

namespace meshsim {

Replica::Replica(const StrategyOptions& options, int rank, bool with_optimizer) {
  {
    CategoryScope scope(MemoryCategory::Parameters);
    ModelOptions model_options;
    model_options.seed = options.seed;
    model_options.rank = rank;
    model_options.gpt = options.gpt;
    model_options.dtype = options.dtype;
    model_options.device = options.device;
    model = build_model(options.model, model_options);
  }
  params = model->parameters();
  allocate_gradients(params);
  if (with_optimizer) optimizer = std::make_unique<Optimizer>(params, options.optimizer);
}

torch::Tensor forward_counting(torch::nn::Sequential& model, torch::Tensor x,
                               std::vector<LayerWork>& layers) {
  const auto children = model->named_children();
  size_t i = 0;
  for (auto& child : *model) {
    torch::Tensor y = child.forward<torch::Tensor>(x);
    layers.push_back(count_layer(children[i].key(), *children[i].value(), x.sizes(), y.sizes()));
    x = std::move(y);
    ++i;
  }
  return x;
}

double Replica::forward_backward(RankContext& ctx, const Batch& batch, int64_t step) {
  CategoryScope scope(MemoryCategory::Activations);
  model->train();
  ctx.sample_memory(step, "batch");
  double t = ctx.now();
  std::vector<LayerWork> layers;
  torch::Tensor x = forward_counting(model, batch.inputs, layers);
  torch::Tensor loss = loss_fn(x, batch.targets);
  x = torch::Tensor();
  ctx.record_compute("forward", step, t);
  attach_work(ctx.recorder.compute.back(), layers);
  ctx.sample_memory(step, "forward");
  t = ctx.now();
  loss.backward();
  ctx.record_compute("backward", step, t);
  attach_work(ctx.recorder.compute.back(), backward_work(layers));
  const double value = loss_value(loss);
  loss = torch::Tensor();
  ctx.sample_memory(step, "backward");
  return value;
}

void Replica::optimizer_step(RankContext& ctx, int64_t step) {
  const double t = ctx.now();
  optimizer->step();
  ctx.record_compute("optimizer", step, t);
  int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const auto& o = optimizer->options();
  attach_work(ctx.recorder.compute.back(), {optimizer_work(numel, o.name, o.momentum != 0)});
  ctx.sample_memory(step, "optimizer");
}

} // namespace meshsim
