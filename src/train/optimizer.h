// Adam and SGD with momentum, with PyTorch's update rules, written out so that meshsim
// controls where their memory is charged: the state is allocated up front under
// `optimizer`, and the step's temporaries count as `other`.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace meshsim {

struct OptimizerOptions {
  std::string name = "adam";  // adam | sgd
  double lr = 1e-3;
  double momentum = 0.9;      // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
};

class Optimizer {
public:
  /// `params` must have their gradients allocated (see allocate_gradients).
  Optimizer(std::vector<torch::Tensor> params, OptimizerOptions options);

  void step();
  /// Zeroes the gradients in place, keeping their memory (and its accounting).
  void zero_grad();

  int64_t step_count() const { return step_count_; }
  const OptimizerOptions& options() const { return options_; }
  /// Bytes of optimizer state (for logs).
  int64_t state_bytes() const;

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

private:
  std::vector<torch::Tensor> params_;
  OptimizerOptions options_;
  std::vector<torch::Tensor> exp_avg_;     // adam m / sgd momentum buffer
  std::vector<torch::Tensor> exp_avg_sq_;  // adam v
  int64_t step_count_ = 0;
};

/// Gives every parameter a zero gradient now, charged to `gradients`, so backward
/// accumulates into it in place instead of allocating it under another category.
void allocate_gradients(const std::vector<torch::Tensor>& params);

} // namespace meshsim
