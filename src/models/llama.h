// llama: a Llama-family decoder (Touvron et al. 2023; Meta's and Hugging Face's layout):
// RMSNorm before attention and MLP, rotary position embeddings, grouped-query attention,
// a SwiGLU MLP, no biases, an untied head and no position embedding. Like the GPT it is a
// Sequential of embed, block0..block{L-1}, norm_f, head, so a pipeline cuts it between
// children, activation checkpointing is a switch on each block or attention core, and tensor
// parallelism replaces q, k, v, o, gate, up, down by name (LinearSlots).
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "models/gpt.h"
#include "models/models.h"

namespace meshsim {

/// Token embedding wte [vocab, hidden]; positions come from the rotary embedding instead.
class LlamaEmbeddingImpl : public torch::nn::Module {
public:
  LlamaEmbeddingImpl(int64_t vocab, int64_t hidden, int64_t seq_len,
                     const torch::TensorOptions& tensors = {});
  /// tokens: int64 [B,T] with T <= seq_len -> [B,T,hidden].
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor wte;

private:
  int64_t seq_len_;
};
TORCH_MODULE(LlamaEmbedding);

/// RMSNorm: x / sqrt(mean(x^2) + eps) * weight over the last dimension, weight only. bf16
/// and fp16 inputs are normalized in float32 and cast back, as Llama's reference does.
class RmsNormImpl : public torch::nn::Module {
public:
  RmsNormImpl(int64_t width, double eps, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

/// Rotary position embedding of x [B, heads, T, head_dim] for positions 0..T-1, rotating
/// the two halves of each head (rotate_half, as Hugging Face's and Meta's Llama do):
/// x·cos + rotate_half(x)·sin with angle position · theta^(-2i/head_dim).
torch::Tensor apply_rotary(const torch::Tensor& x, double theta);

/// Causal grouped-query attention over q [H -> heads·d], k and v [H -> kv_heads·d] and
/// o [heads·d -> H], no biases. Each kv head serves heads/kv_heads consecutive query heads.
/// The heads it runs are read from q's and k's output features, so a column shard of whole
/// heads (heads/tp query and kv_heads/tp kv heads) runs unchanged.
class LlamaAttentionImpl : public torch::nn::Module,
                           public LinearSlots,
                           public CheckpointedAttention,
                           public AttentionHeads {
public:
  LlamaAttentionImpl(int64_t hidden, int64_t heads, int64_t kv_heads, double rope_theta,
                     const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;
  int64_t shard_granularity(const std::string& name) const override;
  int64_t head_dim() const override { return head_dim_; }

private:
  torch::nn::AnyModule& slot(const std::string& name);
  int64_t head_dim_;
  double rope_theta_;
  torch::nn::AnyModule q_, k_, v_, o_;
};
TORCH_MODULE(LlamaAttention);

/// SwiGLU: down(silu(gate(x)) · up(x)); gate, up: H -> F, down: F -> H, no biases.
class SwiGluMlpImpl : public torch::nn::Module, public LinearSlots {
public:
  SwiGluMlpImpl(int64_t hidden, int64_t ffn, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x);
  void replace_linear(const std::string& name, torch::nn::AnyModule module) override;

private:
  torch::nn::AnyModule gate_, up_, down_;
};
TORCH_MODULE(SwiGluMlp);

/// x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)); optionally checkpointed.
class LlamaBlockImpl : public torch::nn::Module, public CheckpointedBlock {
public:
  LlamaBlockImpl(const TransformerShape& options, const torch::TensorOptions& tensors = {});
  torch::Tensor forward(const torch::Tensor& x) { return checkpointed(x); }
  torch::Tensor forward_plain(const torch::Tensor& x) override;

private:
  RmsNorm attn_norm_{nullptr}, mlp_norm_{nullptr};
  LlamaAttention attn_{nullptr};
  SwiGluMlp mlp_{nullptr};
};
TORCH_MODULE(LlamaBlock);

/// The MLP's width: options.ffn_hidden, or Meta's rule for 0: 256 · ceil((8H/3) / 256),
/// two thirds of GPT's 4H (SwiGLU has three matrices, not two) rounded up to a multiple of 256.
int64_t llama_ffn_hidden(const TransformerShape& options);

/// options.kv_heads, or options.heads when it is 0 (multi-head attention).
int64_t llama_kv_heads(const TransformerShape& options);

/// Builds the Llama with every parameter created by `tensors`, then (after
/// torch::manual_seed(seed) again) initializes in parameters() order: RMSNorm weights 1,
/// every other weight (wte, every Linear, the head) normal(0, 0.02), as the GPT does
/// (tests/models/reference_llama.py does the same in PyTorch). Nothing is drawn on meta.
/// Throws std::invalid_argument for bad options (heads not dividing hidden, kv_heads not
/// dividing heads, an odd head_dim, a tied head).
torch::nn::Sequential build_llama(const TransformerShape& options, uint64_t seed,
                                  const torch::TensorOptions& tensors = {});

/// Parameters of the Llama for `options`, with d = H/heads, K = kv heads, F = the MLP width:
/// V·H (embed) + L·(2H² + 2H·K·d + 3H·F + 2H) + H (norm_f) + V·H (head).
int64_t llama_parameter_count(const TransformerShape& options);

} // namespace meshsim
