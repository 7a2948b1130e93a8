// The strategy registry, the shared loss, and `single`: one device, the reference that
// every other strategy is tested against.
#include "parallel/strategy.h"

#include <stdexcept>

#include "memory/allocator.h"
#include "parallel/replica.h"

namespace meshsim {

std::unique_ptr<Strategy> make_ddp(RankContext& ctx, const StrategyOptions& options);
std::unique_ptr<Strategy> make_dp(RankContext& ctx, const StrategyOptions& options);
std::unique_ptr<Strategy> make_hybrid(RankContext& ctx, const StrategyOptions& options);

std::pair<int64_t, int64_t> Strategy::evaluate(const Batch& batch) {
  auto model = eval_model();
  model->eval();
  const torch::Tensor logits = model->forward(batch.inputs);
  model->train();
  return {logits.argmax(-1).eq(batch.targets).sum().item<int64_t>(), batch.targets.numel()};
}

std::vector<torch::Tensor> Strategy::full_parameters() {
  std::vector<torch::Tensor> out;
  for (const auto& p : model()->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool uses_hybrid(const StrategyOptions& o) {
  return o.tp > 1 || o.pp > 1 || o.zero > 0 || o.micro_batches > 1 || o.recompute;
}

torch::Tensor loss_fn(const torch::Tensor& logits, const torch::Tensor& targets) {
  // Language models give [B,T,V] logits for [B,T] targets: one prediction per token.
  if (logits.dim() == 3)
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}),
                                                targets.reshape({-1}));
  return torch::nn::functional::cross_entropy(logits, targets);
}

double loss_value(const torch::Tensor& loss) {
  return loss.is_meta() ? 0.0 : loss.item<double>();
}

namespace {

class SingleStrategy final : public Strategy {
public:
  SingleStrategy(RankContext& ctx, const StrategyOptions& options)
      : ctx_(ctx), replica_(options, ctx.rank, /*with_optimizer=*/true) {}

  double step(const Batch& batch, int64_t step_number) override {
    replica_.optimizer->zero_grad();
    const double loss = replica_.forward_backward(ctx_, batch, step_number);
    replica_.optimizer_step(ctx_, step_number);
    return loss;
  }
  torch::nn::Sequential eval_model() override { return replica_.model; }
  torch::nn::Sequential model() override { return replica_.model; }
  Optimizer* optimizer() override { return replica_.optimizer.get(); }

private:
  RankContext& ctx_;
  Replica replica_;
};

} // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names{"single", "ddp", "dp"};
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, RankContext& ctx,
                                        const StrategyOptions& options) {
  if (name == "ddp" && uses_hybrid(options)) return make_hybrid(ctx, options);
  if (uses_hybrid(options))
    throw std::invalid_argument("--tp, --pp, --zero, --micro-batches and --recompute need --strategy ddp");
  if (name == "single") {
    if (ctx.world_size != 1)
      throw std::invalid_argument("--strategy single runs on one GPU; use --gpus 1");
    return std::make_unique<SingleStrategy>(ctx, options);
  }
  if (name == "ddp") return make_ddp(ctx, options);
  if (name == "dp") return make_dp(ctx, options);
  throw std::invalid_argument("unknown strategy '" + name + "' (choose single, ddp or dp)");
}

} // namespace meshsim
