// Adam and SGD with momentum, with PyTorch's update rules, written out so that meshsim
// controls where their memory is charged: the state is allocated up front under
// `optimizer`, and the step's temporaries count as `other`.
//
// Mixed precision (bf16, fp16) is what Megatron-LM and DeepSpeed do: the parameters and
// gradients the model computes with are 16-bit, and the optimizer keeps an fp32 master copy
// of every 16-bit parameter beside its fp32 moments. A step turns the gradient into fp32,
// updates the master, and rounds the master back into the parameter. fp16 adds dynamic loss
// scaling (see LossScaler).
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace meshsim {

struct OptimizerOptions {
  std::string name = "adam";  // adam | sgd
  double lr = 1e-3;
  double momentum = 0.9;                         // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8; // adam
};

/// Dynamic loss scaling for fp16, with DeepSpeed's defaults (`initial_scale_power` 16,
/// `loss_scale_window` 1000, `min_loss_scale` 1; docs/zero.md): the loss is multiplied by
/// `scale` before backward so that small gradients do not flush to zero in fp16; a step whose
/// gradients overflowed (inf or nan anywhere) is skipped and the scale halved; after
/// kGrowthInterval good steps in a row it doubles. Every factor is a power of two, so scaling
/// and unscaling are exact.
struct LossScaler {
  static constexpr double kInitialScale = 65536.0; // 2^16
  static constexpr double kMinScale = 1.0;
  static constexpr int64_t kGrowthInterval = 1000;

  double scale = kInitialScale;
  int64_t good_steps = 0; // finite steps since the last overflow or growth

  /// Records a step's outcome: halves the scale after an overflow, doubles it after
  /// kGrowthInterval finite steps.
  void update(bool finite);
};

class Optimizer {
public:
  /// `params` must have their gradients allocated (see allocate_gradients). 16-bit parameters
  /// (bf16, fp16) get fp32 master weights and fp32 moments; fp16 ones also loss scaling.
  /// Every tensor is made on its parameter's device (meta included).
  Optimizer(std::vector<torch::Tensor> params, OptimizerOptions options);

  /// Takes the step. `grads_finite` false (an fp16 overflow on some rank, agreed by all)
  /// skips it: nothing changes but the loss scale, which halves. Returns whether it stepped.
  bool step(bool grads_finite = true);
  /// Zeroes the gradients in place, keeping their memory (and its accounting).
  void zero_grad();

  /// Whether the parameters are 16-bit, with fp32 master weights here.
  bool mixed_precision() const { return !masters_.empty(); }
  /// Whether the loss must be scaled (fp16 parameters).
  bool loss_scaling() const { return loss_scaling_; }
  /// The factor to multiply the loss by before backward: 1 without loss scaling.
  double loss_scale() const { return loss_scaling_ ? scaler_.scale : 1.0; }
  const LossScaler& scaler() const { return scaler_; }
  /// Whether every gradient this optimizer updates from is finite. Reads the gradients, so
  /// on the meta device (no values) it answers true: a plan assumes no overflow.
  bool grads_finite() const;

  const std::vector<torch::Tensor>& params() const { return params_; }
  int64_t step_count() const { return step_count_; }
  const OptimizerOptions& options() const { return options_; }
  /// Bytes of optimizer state, master weights included (for logs).
  int64_t state_bytes() const;

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

private:
  void update(size_t i, torch::Tensor target, const torch::Tensor& grad);

  std::vector<torch::Tensor> params_;
  OptimizerOptions options_;
  std::vector<torch::Tensor> masters_;    // fp32 copies of 16-bit params (empty otherwise)
  std::vector<torch::Tensor> exp_avg_;    // adam m / sgd momentum buffer
  std::vector<torch::Tensor> exp_avg_sq_; // adam v
  bool loss_scaling_ = false;
  LossScaler scaler_;
  int64_t step_count_ = 0;
};

/// Whether `dtype` is a 16-bit floating type trained in mixed precision (bf16, fp16).
bool is_low_precision(torch::Dtype dtype);

/// Gives every parameter a zero gradient now, charged to `gradients`, so backward
/// accumulates into it in place instead of allocating it under another category.
void allocate_gradients(const std::vector<torch::Tensor>& params);

} // namespace meshsim
