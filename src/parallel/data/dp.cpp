// DataParallel: one controller on GPU 0. Each step GPU 0 copies its parameters to every
// replica, scatters the global batch, gathers every replica's outputs, computes the loss of
// the whole batch, sends each replica the gradient of its outputs, and sums the replicas'
// parameter gradients back onto itself. Only GPU 0 has an optimizer. GPU 0 therefore holds
// more than any other GPU (the whole batch, all outputs, the optimizer state): the reason
// PyTorch recommends DDP.
#include <fmt/format.h>

#include "memory/allocator.h"
#include "parallel/data/buckets.h"
#include "parallel/replica.h"

namespace meshsim {
namespace {

constexpr int kRoot = 0;
constexpr int kTagInputs = 1, kTagOutputs = 2, kTagOutputGrads = 3;

class DpStrategy final : public Strategy {
public:
  DpStrategy(RankContext& ctx, const StrategyOptions& options)
      : ctx_(ctx), replica_(options, ctx.rank, /*with_optimizer=*/ctx.rank == kRoot),
        buckets_(replica_.params, options.bucket_mb), world_(Group::world(ctx.world_size)) {}

  bool rank0_loads_global_batch() const override { return true; }

  double step(const Batch& global, int64_t step_number) override {
    if (replica_.optimizer) replica_.optimizer->zero_grad();
    else zero_grads();
    replicate();

    // Scatter the global batch (torch.chunk sizes) from GPU 0.
    Batch local;
    std::vector<int64_t> sizes;
    {
      CategoryScope scope(MemoryCategory::Activations);
      if (ctx_.rank == kRoot) {
        sizes = chunk_sizes(global.size());
        int64_t offset = 0;
        for (int r = 0; r < ctx_.world_size; ++r) {
          Batch part{global.inputs.narrow(0, offset, sizes[r]),
                     global.targets.narrow(0, offset, sizes[r]), {}};
          offset += sizes[r];
          if (r == kRoot) {
            local = part;
          } else {
            ctx_.comm.send(part.inputs, r, kTagInputs);
          }
        }
      } else {
        local.inputs = ctx_.comm.recv(kRoot, kTagInputs);
      }
    }
    ctx_.sample_memory(step_number, "scatter");

    // Forward on each replica; outputs gathered to GPU 0, which computes the loss.
    CategoryScope scope(MemoryCategory::Activations);
    replica_.model->train();
    auto t = ctx_.mark();
    torch::Tensor outputs = replica_.model->forward(model_inputs(local.inputs, replica_.dtype));
    ctx_.record_compute("forward", step_number, t);
    double loss_value = 0;
    torch::Tensor output_grad;
    if (ctx_.rank == kRoot) {
      std::vector<torch::Tensor> all{outputs.detach()};
      for (int r = 1; r < ctx_.world_size; ++r) all.push_back(ctx_.comm.recv(r, kTagOutputs));
      torch::Tensor gathered = torch::cat(all).requires_grad_(true);
      torch::Tensor loss = loss_fn(gathered, global.targets, replica_.loss_upcast);
      // fp16: the output gradients every replica receives carry the loss scale.
      const double scale = replica_.optimizer->loss_scale();
      if (scale != 1.0) (loss * scale).backward();
      else loss.backward();
      loss_value = loss.item<double>();
      ctx_.sample_memory(step_number, "forward");
      int64_t offset = 0;
      for (int r = 0; r < ctx_.world_size; ++r) {
        torch::Tensor g = gathered.grad().narrow(0, offset, sizes[r]);
        offset += sizes[r];
        if (r == kRoot) output_grad = g;
        else ctx_.comm.send(g, r, kTagOutputGrads);
      }
    } else {
      ctx_.comm.send(outputs.detach(), kRoot, kTagOutputs);
      ctx_.sample_memory(step_number, "forward");
      output_grad = ctx_.comm.recv(kRoot, kTagOutputGrads);
    }

    t = ctx_.mark();
    if (outputs.numel() > 0) outputs.backward(output_grad);
    ctx_.record_compute("backward", step_number, t);
    outputs = torch::Tensor();
    output_grad = torch::Tensor();
    ctx_.sample_memory(step_number, "backward");

    buckets_.reduce_sum(ctx_.comm, kRoot, world_);
    ctx_.sample_memory(step_number, "reduce");
    // Only GPU 0 steps, on the gradients summed onto it: its own check decides an overflow.
    if (replica_.optimizer)
      replica_.optimizer_step(ctx_, step_number,
                              !replica_.optimizer->loss_scaling() || replica_.optimizer->grads_finite());
    return loss_value;
  }

  torch::nn::Sequential eval_model() override {
    replicate();
    return replica_.model;
  }
  torch::nn::Sequential model() override { return replica_.model; }
  Optimizer* optimizer() override { return replica_.optimizer.get(); }

private:
  // torch.chunk: ceil(n / world) per chunk, the last ones smaller or empty.
  std::vector<int64_t> chunk_sizes(int64_t n) const {
    const int64_t per = (n + ctx_.world_size - 1) / ctx_.world_size;
    std::vector<int64_t> sizes;
    int64_t left = n;
    for (int r = 0; r < ctx_.world_size; ++r) {
      sizes.push_back(std::min(per, left));
      left -= sizes.back();
    }
    return sizes;
  }

  void replicate() {
    torch::NoGradGuard no_grad;
    CategoryScope scope(MemoryCategory::Communication);
    for (auto& p : replica_.params) ctx_.comm.broadcast(p, kRoot, world_);
  }

  void zero_grads() {
    for (auto& p : replica_.params) p.mutable_grad().zero_();
  }

  RankContext& ctx_;
  Replica replica_;
  GradientBuckets buckets_;
  Group world_;
};

} // namespace

std::unique_ptr<Strategy> make_dp(RankContext& ctx, const StrategyOptions& options) {
  return std::make_unique<DpStrategy>(ctx, options);
}

} // namespace meshsim
