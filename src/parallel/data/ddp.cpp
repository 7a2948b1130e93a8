// DistributedDataParallel: every rank holds the whole model and its own optimizer. The
// initial parameters are broadcast from rank 0; gradients are averaged with one all-reduce
// per bucket, each started during backward as soon as its gradients are there (or, with
// --no-overlap, after backward); every rank then takes the same optimizer step.
#include "memory/allocator.h"
#include "parallel/data/buckets.h"
#include "parallel/fp8_state.h"
#include "parallel/replica.h"

namespace meshsim {
namespace {

class DdpStrategy final : public Strategy {
public:
  DdpStrategy(RankContext& ctx, const StrategyOptions& options)
      : ctx_(ctx), replica_(options, ctx.rank, /*with_optimizer=*/true),
        buckets_(replica_.params, options.bucket_mb), world_(Group::world(ctx.world_size)),
        overlap_(options.overlap) {
    torch::NoGradGuard no_grad;
    if (options.fp8) // a plan at --precision fp8: parallel/fp8_state.h
      fp8_state_ = allocate_fp8_state(fp8_footprint(replica_.model, {}, 0), options.device);
    CategoryScope scope(MemoryCategory::Communication);
    for (auto& p : replica_.params) ctx_.comm.broadcast(p, 0, world_);
  }

  double step(const Batch& batch, int64_t step_number) override {
    replica_.optimizer->zero_grad();
    if (overlap_)
      buckets_.start_overlapped(ctx_.comm, world_);
    const double local_loss = replica_.forward_backward(ctx_, batch, step_number);
    if (overlap_)
      buckets_.finish_overlapped();
    else
      buckets_.all_reduce_average(ctx_.comm, world_);
    ctx_.sample_memory(step_number, "all_reduce");
    replica_.optimizer_step(ctx_, step_number,
                            gradients_finite(ctx_, *replica_.optimizer, world_));
    return global_mean_loss(local_loss, batch.size());
  }

  torch::nn::Sequential eval_model() override { return replica_.model; }
  torch::nn::Sequential model() override { return replica_.model; }
  Optimizer* optimizer() override { return replica_.optimizer.get(); }

private:
  double global_mean_loss(double local_mean, int64_t samples) {
    CategoryScope scope(MemoryCategory::Communication);
    torch::Tensor stats = torch::tensor({local_mean * static_cast<double>(samples),
                                         static_cast<double>(samples)},
                                        torch::kFloat64);
    ctx_.comm.all_reduce(stats, ReduceOp::Sum, world_);
    const auto* s = stats.data_ptr<double>();
    return s[1] > 0 ? s[0] / s[1] : 0.0;
  }

  RankContext& ctx_;
  Replica replica_;
  GradientBuckets buckets_;
  Group world_;
  bool overlap_;
  std::vector<torch::Tensor> fp8_state_;
};

} // namespace

std::unique_ptr<Strategy> make_ddp(RankContext& ctx, const StrategyOptions& options) {
  return std::make_unique<DdpStrategy>(ctx, options);
}

} // namespace meshsim
