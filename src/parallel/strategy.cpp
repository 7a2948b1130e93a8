// The strategy registry, the shared loss, and `single`: one device, the reference that
// every other strategy is tested against.
#include "parallel/strategy.h"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <stdexcept>

#include <ATen/Context.h>

#include "memory/allocator.h"
#include "parallel/replica.h"
#include "parallel/tensor/cross_entropy.h"

namespace meshsim {

std::unique_ptr<Strategy> make_ddp(RankContext& ctx, const StrategyOptions& options);
std::unique_ptr<Strategy> make_dp(RankContext& ctx, const StrategyOptions& options);
std::unique_ptr<Strategy> make_hybrid(RankContext& ctx, const StrategyOptions& options);

std::pair<int64_t, int64_t> Strategy::evaluate(const Batch& batch) {
  auto model = eval_model();
  model->eval();
  const auto params = model->parameters();
  const torch::Tensor inputs =
      params.empty() ? batch.inputs : model_inputs(batch.inputs, params.front().scalar_type());
  const torch::Tensor logits = model->forward(inputs);
  model->train();
  return {logits.argmax(-1).eq(batch.targets).sum().item<int64_t>(), batch.targets.numel()};
}

std::vector<torch::Tensor> Strategy::full_parameters() {
  std::vector<torch::Tensor> out;
  for (const auto& p : model()->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool uses_hybrid(const StrategyOptions& o) {
  return o.tp > 1 || o.pp > 1 || o.zero > 0 || o.micro_batches > 1 ||
         o.recompute != Recompute::None || o.cp > 1 || o.ep > 1;
}

torch::Dtype compute_dtype(const StrategyOptions& options) {
  if (options.precision == "fp32")
    return options.dtype;
  if (options.precision != "bf16" && options.precision != "fp16")
    throw std::invalid_argument("unknown precision '" + options.precision +
                                "' (choose fp32, bf16 or fp16)");
  if (options.dtype != torch::kFloat32)
    throw std::invalid_argument("--precision " + options.precision +
                                " trains a float32 model in 16 bits, not a " +
                                std::string(c10::toString(options.dtype)) + " one");
  return options.precision == "bf16" ? torch::kBFloat16 : torch::kHalf;
}

void ensure_kernels_for(torch::Dtype dtype) {
  if (dtype != torch::kBFloat16)
    return;
  static std::once_flag once;
  std::call_once(once, [] {
    GpuGuard host(nullptr); // a probe on the host, charged to no virtual GPU
    try {
      const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
      torch::Tensor w = torch::ones({4, 4}, bf16).requires_grad_(true);
      torch::linear(torch::ones({2, 4}, bf16), w, torch::ones({4}, bf16)).sum().backward();
      torch::Tensor k = torch::ones({2, 1, 3, 3}, bf16).requires_grad_(true);
      torch::conv2d(torch::ones({1, 1, 6, 6}, bf16), k).sum().backward();
    } catch (const std::exception&) { // dnnl::error, not a c10::Error
      at::globalContext().setUserEnabledMkldnn(false);
      std::cerr << "meshsim: oneDNN has no bf16 kernels on this CPU (no AVX-512): bf16 runs on "
                   "ATen's own kernels\n";
    }
  });
}

torch::Tensor batch_samples(const Batch& batch, int replica) {
  if (batch.samples.defined())
    return batch.samples;
  GpuGuard host(nullptr); // indices, not activations: a GPU kernel reads them as arguments
  const int64_t n = batch.size();
  return torch::arange(replica * n, (replica + 1) * n, torch::kLong);
}

torch::Tensor model_inputs(const torch::Tensor& inputs, torch::Dtype dtype) {
  if (!inputs.defined() || !inputs.is_floating_point() || inputs.scalar_type() == dtype)
    return inputs;
  return inputs.to(dtype);
}

torch::Tensor loss_fn(const torch::Tensor& logits_in, const torch::Tensor& targets, bool upcast) {
  const torch::Tensor logits = upcast && is_low_precision(logits_in.scalar_type())
                                   ? logits_in.to(torch::kFloat32)
                                   : logits_in;
  // Language models give [B,T,V] logits for [B,T] targets: one prediction per token.
  if (logits.dim() == 3)
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(2)}),
                                                targets.reshape({-1}));
  return torch::nn::functional::cross_entropy(logits, targets);
}

LossWork loss_work(double tokens, double classes, double elem_bytes, bool upcast) {
  const double n = tokens * classes;
  const bool cast = upcast && elem_bytes < 4;
  const double eb = cast ? 4 : elem_bytes; // what log-softmax reads and writes
  LossWork work;
  LayerWork& f = work.forward;
  f.layer = "loss";
  f.op = "elementwise";
  if (cast) add_kernel(f, 0, n * (elem_bytes + 4));              // to fp32
  add_elementwise(f, n, 5, 1, 1, eb);                            // log-softmax
  add_kernel(f, tokens, 16 * tokens);                            // the targets' entries
  LayerWork& b = work.backward;
  b.layer = "loss";
  b.op = "elementwise";
  add_elementwise(b, n, 0, 0, 1, eb);                            // zeros
  add_kernel(b, tokens, 16 * tokens);                            // the targets' −1/N
  add_elementwise(b, n, 3, 2, 1, eb);                            // log-softmax's backward
  if (cast) add_kernel(b, 0, n * (4 + elem_bytes));              // back to the logits' type
  return work;
}

TrainingLoss::TrainingLoss(Communicator& comm, Group group, int index)
    : comm_(&comm), group_(std::move(group)), index_(index) {}

torch::Tensor TrainingLoss::operator()(const torch::Tensor& output,
                                       const torch::Tensor& targets) const {
  return comm_ ? vocab_parallel_cross_entropy(output, targets, *comm_, group_, index_)
               : loss_fn(output, targets, upcast_);
}

LossWork TrainingLoss::work(const torch::Tensor& output) const {
  const double width = output.dim() > 0 ? static_cast<double>(output.size(-1)) : 1;
  const double tokens = static_cast<double>(output.numel()) / std::max(width, 1.0);
  const double eb = static_cast<double>(output.element_size());
  return comm_ ? vocab_parallel_cross_entropy_work(tokens, width, eb)
               : loss_work(tokens, width, eb, upcast_);
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
    // One device: its own gradients decide an fp16 overflow.
    const bool finite = !replica_.optimizer->loss_scaling() || replica_.optimizer->grads_finite();
    replica_.optimizer_step(ctx_, step_number, finite);
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
  if (options.fp8 && name != "ddp")
    throw std::invalid_argument("--precision fp8 plans --strategy ddp (with any layout), not " +
                                name);
  if (options.recompute == Recompute::Op && options.tp > 1)
    throw std::invalid_argument(kRecomputeOpNeedsTp1);
  if (name == "ddp" && uses_hybrid(options)) return make_hybrid(ctx, options);
  if (uses_hybrid(options))
    throw std::invalid_argument("--tp, --pp, --cp, --zero, --micro-batches and --recompute need --strategy ddp");
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
