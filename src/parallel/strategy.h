// Strategy: how one rank takes a training step. Every strategy wraps an unmodified model
// built by models/, and the trainer runs the same loop for all of them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mesh/rank_runner.h"
#include "train/optimizer.h"

namespace meshsim {

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

struct StrategyOptions {
  std::string model = "cnn";
  uint64_t seed = 0;
  OptimizerOptions optimizer;
  double bucket_mb = 25;
  int fault_rank = -1;          // --inject-fault: this rank skips the gradient all-reduce...
  int64_t fault_step = -1;      // ...at this (1-based) step
};

class Strategy {
public:
  virtual ~Strategy() = default;

  /// One training step on this rank's batch. Returns the loss averaged over every sample
  /// of the step on every rank (valid on rank 0; other ranks may return it too).
  virtual double step(const Batch& batch, int64_t step_number) = 0;

  /// True when rank 0 loads the whole global batch and scatters it (DataParallel).
  virtual bool rank0_loads_global_batch() const { return false; }

  /// Makes this rank's model current for evaluation and returns it.
  virtual torch::nn::Sequential eval_model() = 0;

  /// The authoritative model and optimizer for checkpoints (rank 0's).
  virtual torch::nn::Sequential model() = 0;
  virtual Optimizer* optimizer() = 0;
};

/// Names accepted by --strategy.
const std::vector<std::string>& strategy_names();

/// Builds `name` for the calling rank: the model (charged as `parameters`), gradients,
/// optimizer state and any communication buffers. Collective: all ranks call it.
std::unique_ptr<Strategy> make_strategy(const std::string& name, RankContext& ctx,
                                        const StrategyOptions& options);

/// Cross-entropy on logits, the loss every strategy trains.
torch::Tensor loss_fn(const torch::Tensor& logits, const torch::Tensor& targets);

} // namespace meshsim
