// The phases shared by every strategy.
#include "parallel/replica.h"

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
    model = build_model(options.model, model_options);
  }
  params = model->parameters();
  allocate_gradients(params);
  if (with_optimizer) optimizer = std::make_unique<Optimizer>(params, options.optimizer);
}

double Replica::forward_backward(RankContext& ctx, const Batch& batch, int64_t step) {
  CategoryScope scope(MemoryCategory::Activations);
  model->train();
  ctx.sample_memory(step, "batch");
  double t = ctx.now();
  torch::Tensor loss = loss_fn(model->forward(batch.inputs), batch.targets);
  ctx.record_compute("forward", step, t);
  ctx.sample_memory(step, "forward");
  t = ctx.now();
  loss.backward();
  ctx.record_compute("backward", step, t);
  const double value = loss.item<double>();
  loss = torch::Tensor();
  ctx.sample_memory(step, "backward");
  return value;
}

void Replica::optimizer_step(RankContext& ctx, int64_t step) {
  const double t = ctx.now();
  optimizer->step();
  ctx.record_compute("optimizer", step, t);
  ctx.sample_memory(step, "optimizer");
}

} // namespace meshsim
