// llama: a Llama-family decoder (Touvron et al. 2023; Meta's and Hugging Face's layout):
// RMSNorm before attention and MLP, rotary position embeddings, grouped-query attention,
// a SwiGLU MLP, no biases, an untied head (tied with tie_head) and no position embedding. Like the
// GPT it is a Sequential of embed, block0..block{L-1}, norm_f, head assembled from models/layers/;
// its parallel plan (llama_plan.cpp) says where a pipeline cuts it and which of q, k, v, o, gate,
// up, down tensor parallelism replaces (LinearSlots); activation checkpointing is a switch on
// each block or attention core.
#pragma once

#include <cstdint>
#include <memory>

#include <torch/torch.h>

#include "models/gpt.h"
#include "models/layers/moe.h"
#include "models/layers/norms.h"
#include "models/models.h"

namespace meshsim {

/// Token embedding wte [vocab, hidden]; positions come from the rotary embedding instead.
class LlamaEmbeddingImpl : public torch::nn::Module, public VocabSlots {
public:
  LlamaEmbeddingImpl(int64_t vocab, int64_t hidden, int64_t seq_len,
                     const torch::TensorOptions& tensors = {});
  /// tokens: int64 [B,T] with T <= seq_len -> [B,T,hidden] (split over the vocabulary: the
  /// members' lookups summed).
  torch::Tensor forward(const torch::Tensor& tokens);
  void split_vocabulary(int64_t first, int64_t rows,
                        std::function<torch::Tensor(const torch::Tensor&)> sum) override;
  bool vocabulary_split() const override { return static_cast<bool>(sum_); }
  torch::Tensor word_table() const override { return wte; }
  torch::Tensor wte;

private:
  int64_t seq_len_;
  int64_t first_ = 0;
  std::function<torch::Tensor(const torch::Tensor&)> sum_;
};
TORCH_MODULE(LlamaEmbedding);

/// The Llama block: RMSNorm attn_norm, attention attn (q, k, v, o without biases, grouped
/// kv heads, rotary q and k, the eager causal core), RMSNorm mlp_norm, feed-forward mlp
/// (llama_feed_forward for its layer).
class LlamaBlockImpl : public PreNormBlockImpl {
public:
  LlamaBlockImpl(const TransformerShape& options, const torch::TensorOptions& tensors = {},
                 int64_t layer = 0);
};
TORCH_MODULE(LlamaBlock);

/// The feed-forward of layer `layer`: SwiGluMlp (gate, up: H -> F, down: F -> H),
/// F = llama_ffn_hidden(options), or from options.moe.dense_layers on, when options.moe has
/// experts, a mixture of experts (models/layers/moe.h, llama_moe_options).
std::shared_ptr<FeedForward> llama_feed_forward(const TransformerShape& options, int64_t layer,
                                                const torch::TensorOptions& tensors = {});

/// Whether layer `layer`'s feed-forward is a mixture of experts.
bool llama_moe_layer(const TransformerShape& options, int64_t layer);

/// The MoE layers' options from options.moe (the routed experts' width: moe.ffn, or
/// llama_ffn_hidden's when 0).
MoeOptions llama_moe_options(const TransformerShape& options);

/// The MLP's width: options.ffn_hidden, or Meta's rule for 0: 256 · ceil((8H/3) / 256),
/// two thirds of GPT's 4H (SwiGLU has three matrices, not two) rounded up to a multiple of 256.
int64_t llama_ffn_hidden(const TransformerShape& options);

/// options.kv_heads, or options.heads when it is 0 (multi-head attention).
int64_t llama_kv_heads(const TransformerShape& options);

/// options.head_dim, or hidden / heads when it is 0.
int64_t llama_head_dim(const TransformerShape& options);

/// Builds the Llama with every parameter created by `tensors`, then (after
/// torch::manual_seed(seed) again) initializes in parameters() order: RMSNorm weights 1,
/// every other weight (wte, every Linear, the head) normal(0, 0.02), as the GPT does
/// (tests/models/reference_llama.py does the same in PyTorch). Nothing is drawn on meta.
/// With tie_head the head is a TiedHead reading the embedding's wte (tie_word_embeddings).
/// Throws std::invalid_argument for bad options (heads not dividing hidden, kv_heads not
/// dividing heads, an odd head_dim).
torch::nn::Sequential build_llama(const TransformerShape& options, uint64_t seed,
                                  const torch::TensorOptions& tensors = {});

/// The Llama's parallel plan for `options` (llama_plan.cpp): per block attn.q, attn.k, attn.v,
/// mlp.gate, mlp.up column-parallel and attn.o, mlp.down row-parallel; the head over the
/// vocabulary; each block a pipeline unit and its attn an attention.
ParallelPlan llama_parallel_plan(const TransformerShape& options);

/// Parameters of the Llama for `options`, with d = llama_head_dim, n = heads, K = kv heads,
/// F = the MLP width: V·H (embed) + L·(2H·n·d + 2H·K·d + 3H·F + 2H) + H (norm_f) + V·H (head,
/// unless tied),
/// plus n·d + 2K·d per layer with q/k/v biases, H with an output bias, 2d with q/k norms, and
/// an MoE layer's parameters instead of 3H·F in its layers. With latent attention (options.latent)
/// its projections replace q, k, v, o: with r_q, r_kv the ranks, e = nope + rope,
/// H·r_q + r_q + r_q·n·e (or H·n·e without r_q), H·(r_kv + rope) + r_kv + r_kv·n·(nope + v_dim),
/// and n·v_dim·H.
int64_t llama_parameter_count(const TransformerShape& options);

/// The parameters a token meets (active parameters): llama_parameter_count less, in every MoE
/// layer, the experts it does not visit ((experts - top_k) · 3·H·F); the router and the shared
/// experts count whole. Equal to the total for a dense Llama.
int64_t llama_active_parameter_count(const TransformerShape& options);

} // namespace meshsim
