// Replica: one rank's copy of the model with its gradients and (optionally) optimizer, and
// the forward/backward/optimizer phases every strategy shares. Each phase is charged to its
// memory category, sampled into the memory timeline, and recorded as a compute region.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "mesh/recorder.h"
#include "parallel/strategy.h"

namespace meshsim {

/// Runs `model`'s children one by one, as Sequential::forward does, and appends each child's
/// forward work (FLOPs and bytes, counted from the shapes it saw) to `layers`: LibTorch has
/// no forward hooks.
torch::Tensor forward_counting(torch::nn::Sequential& model, torch::Tensor x,
                               std::vector<LayerWork>& layers);

struct Replica {
  Replica(const StrategyOptions& options, int rank, bool with_optimizer);

  /// Forward and backward on `batch`; returns the batch's mean loss. Gradients accumulate
  /// into the preallocated `.grad`s.
  double forward_backward(RankContext& ctx, const Batch& batch, int64_t step);
  void optimizer_step(RankContext& ctx, int64_t step);

  torch::nn::Sequential model;
  std::vector<torch::Tensor> params;
  std::unique_ptr<Optimizer> optimizer;
};

} // namespace meshsim
