// A pre-norm transformer block assembled from slots: x + attn(norm1(x)), then
// x + mlp(norm2(x)), optionally checkpointed, with Megatron's hidden dropout on each branch's
// output before its residual add in training (models/layers/dropout.h). The model picks each slot per layer: the
// normalization (LayerNorm, RMSNorm), the attention (its projections and core) and the
// feed-forward (dense today; a mixture of experts in some layers tomorrow).
#pragma once

#include <memory>
#include <string>

#include <torch/torch.h>

#include "models/layers/attention.h"
#include "models/layers/mlp.h"
#include "models/layers/recompute.h"

namespace meshsim {

/// The parts of one block, registered in this order (their parameters' order): norm1,
/// attention "attn", norm2, feed-forward "mlp".
struct BlockParts {
  std::string norm1_name, norm2_name;
  torch::nn::AnyModule norm1, norm2;
  Attention attention{nullptr};
  std::shared_ptr<FeedForward> feed_forward;
  double dropout = 0; // hidden dropout of the attention's and the feed-forward's outputs
  int64_t layer = 0;  // the block's index in the whole model (dropout's masks)
};

class PreNormBlockImpl : public torch::nn::Module,
                         public CheckpointedBlock,
                         public ElementwiseWork {
public:
  explicit PreNormBlockImpl(BlockParts parts);
  torch::Tensor forward(const torch::Tensor& x) { return checkpointed(x); }
  torch::Tensor forward_plain(const torch::Tensor& x) override;
  /// Its two residual adds, on the block's input rows (flops.h).
  void add_elementwise_work(LayerWork& total, double rows, double gathered, double width,
                            double eb) const override;

private:
  torch::nn::AnyModule norm1_, norm2_;
  Attention attn_{nullptr};
  std::shared_ptr<FeedForward> mlp_;
  double dropout_;
  int64_t layer_;
};

} // namespace meshsim
