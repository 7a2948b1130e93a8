// The feed-forward slot of a transformer block (FeedForward) and its dense kinds: GPT's MLP
// and Llama's SwiGLU. A mixture of experts is another FeedForward in a sibling file, chosen
// per layer by the model (DeepSeek's first layers are dense, the rest MoE).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "models/layers/flops.h"
#include "models/layers/recompute.h"
#include "models/layers/slots.h"

namespace meshsim {

/// What a block's "mlp" child is: [B, T, H] -> [B, T, H], token by token.
class FeedForward : public torch::nn::Module {
public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

/// fc (H -> F), exact GELU, proj (F -> H), with biases.
class GptMlpImpl : public FeedForward,
                   public LinearSlots,
                   public KeepsLinears,
                   public ElementwiseWork {
public:
  GptMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x) override;
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;
  /// GELU, on fc's output (this rank's share of F under tensor parallelism).
  void add_elementwise_work(LayerWork& total, double rows, double gathered, double width,
                            double eb) const override;
  /// Op-level recomputation keeps fc's and proj's outputs (recompute.h).
  bool keeps_linear(const std::string& name) const override {
    return name == "fc" || name == "proj";
  }

private:
  torch::nn::AnyModule fc_, proj_;
};
TORCH_MODULE(GptMlp);

/// SwiGLU: down(silu(gate(x)) · up(x)); gate, up: H -> F, down: F -> H, no biases.
class SwiGluMlpImpl : public FeedForward,
                      public LinearSlots,
                      public KeepsLinears,
                      public ElementwiseWork {
public:
  SwiGluMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x) override;
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;
  /// SiLU and the product, on gate's output (this rank's share of F under tensor parallelism).
  void add_elementwise_work(LayerWork& total, double rows, double gathered, double width,
                            double eb) const override;
  /// Op-level recomputation keeps gate's and down's outputs and runs up again (recompute.h).
  bool keeps_linear(const std::string& name) const override {
    return name == "gate" || name == "down";
  }

private:
  torch::nn::AnyModule gate_, up_, down_;
};
TORCH_MODULE(SwiGluMlp);

} // namespace meshsim
