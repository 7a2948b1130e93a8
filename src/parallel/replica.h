// Replica: one rank's copy of the model with its gradients and (optionally) optimizer, and
// the forward/backward/optimizer phases every strategy shares. Each phase is charged to its
// memory category, sampled into the memory timeline, and recorded as a compute region.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "comm/recorder.h"
#include "parallel/strategy.h"

namespace meshsim {

/// Runs `model`'s children one by one, as Sequential::forward does, and appends each child's
/// forward work (FLOPs and bytes, counted from the shapes it saw) to `layers`: LibTorch has
/// no forward hooks.
torch::Tensor forward_counting(torch::nn::Sequential& model, torch::Tensor x,
                               std::vector<LayerWork>& layers);

struct Replica {
  Replica(const StrategyOptions& options, int rank, bool with_optimizer);

  /// Forward and backward on `batch` (with dropout, the rows are the global batch's
  /// batch_samples(batch, ctx.rank): rank r's shard); returns the batch's mean loss. Gradients accumulate
  /// into the preallocated `.grad`s (multiplied by the optimizer's loss scale, if any).
  double forward_backward(RankContext& ctx, const Batch& batch, int64_t step);
  /// The optimizer's step; `grads_finite` false skips it (fp16 overflow).
  void optimizer_step(RankContext& ctx, int64_t step, bool grads_finite = true);

  torch::Dtype dtype; // the model's (compute_dtype)
  uint64_t seed = 0;   // the run's: its dropout masks' (models/layers/dropout.h)
  double dropout = 0;  // the model's dropout probability; 0: no draw is installed
  bool loss_upcast = true; // StrategyOptions::loss_upcast
  torch::nn::Sequential model;
  std::vector<torch::Tensor> params;
  std::unique_ptr<Optimizer> optimizer;
};

/// fp16: whether the gradients are finite on every rank of `group`, agreed through one
/// all-reduce (max) of an overflow flag, so that all of them step or all skip (ZeRO shards
/// and model-parallel parts see different gradients). True, with no collective, when the
/// optimizer does not scale the loss. Every rank of `group` calls it. On the meta device
/// there are no values to read: true, after the same collective.
bool gradients_finite(RankContext& ctx, const Optimizer& optimizer, const Group& group);

} // namespace meshsim
