// gpt: a small decoder-only transformer (GPT-2 layout, pre-LayerNorm, causal attention, no
// dropout) as a Sequential of embed, block0..block{L-1}, ln_f, head, assembled from the slots
// of models/layers/, so strategies can wrap it unmodified: its parallel plan (gpt_plan.cpp,
// models/parallel_plan.h) says which Linears tensor parallelism swaps (LinearSlots), where the
// vocabulary-parallel head is and where a pipeline may cut; activation checkpointing is a
// switch on each block or on each attention core (set_recompute).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/layers/attention.h"
#include "models/layers/block.h"
#include "models/layers/mlp.h"
#include "models/layers/recompute.h"
#include "models/layers/slots.h"
#include "models/models.h"
#include "models/parallel_plan.h"

namespace meshsim {

/// GPT-2's initializer range: the standard deviation every weight of the GPT and the Llama
/// is drawn with (Llama's initializer_range is 0.02 too).
constexpr double kInitStd = 0.02;

/// Token embedding wte [vocab, hidden] plus learned position embedding wpe [seq_len, hidden].
class GptEmbeddingImpl : public torch::nn::Module, public VocabSlots {
public:
  GptEmbeddingImpl(int64_t vocab, int64_t hidden, int64_t seq_len,
                   const torch::TensorOptions& tensors = {});
  /// tokens: int64 [B,T] with T <= seq_len -> [B,T,hidden]; `positions` (int64 [T], each
  /// below seq_len) pick the rows of wpe; undefined: 0..T-1. Split over the vocabulary, the
  /// members' word lookups are summed before wpe (whole on every member) is added.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& positions = {});
  void split_vocabulary(int64_t first, int64_t rows,
                        std::function<torch::Tensor(const torch::Tensor&)> sum) override;
  bool vocabulary_split() const override { return static_cast<bool>(sum_); }
  torch::Tensor word_table() const override { return wte; }
  torch::Tensor wte, wpe;

protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})

private:
  int64_t first_ = 0;
  std::function<torch::Tensor(const torch::Tensor&)> sum_;
};

/// `table`'s rows [first, first + rows) in its place (the same parameter, now those rows).
void keep_vocabulary_rows(torch::Tensor& table, int64_t first, int64_t rows);
TORCH_MODULE(GptEmbedding);

/// The GPT block: LayerNorm ln1, attention attn (q, k, v, out with biases, the eager causal
/// core), LayerNorm ln2, feed-forward mlp (gpt_feed_forward for its layer).
class GptBlockImpl : public PreNormBlockImpl {
public:
  GptBlockImpl(const TransformerShape& options, int64_t layer,
               const torch::TensorOptions& tensors = {});
};
TORCH_MODULE(GptBlock);

/// The feed-forward of layer `layer`: GptMlp (fc H -> F, exact GELU, proj F -> H) in every
/// layer today, F = gpt_ffn_hidden(options). Where a per-layer choice (an MoE) goes.
std::shared_ptr<FeedForward> gpt_feed_forward(const TransformerShape& options, int64_t layer,
                                              const torch::TensorOptions& tensors = {});

/// The head of a tied model: logits = x @ wte^T with the embedding's own wte. The weight is
/// not registered here, so parameters() lists it once (at embed.wte, as PyTorch does).
class TiedHeadImpl : public torch::nn::Module, public MatmulLeaf {
public:
  explicit TiedHeadImpl(GptEmbedding embed)
      : embed_(torch::nn::AnyModule(embed)), wte_(&embed->wte) {}
  /// Any embedding module `embed` whose word embedding is the member `*wte` (the llama's).
  TiedHeadImpl(torch::nn::AnyModule embed, const torch::Tensor* wte)
      : embed_(std::move(embed)), wte_(wte) {}
  torch::Tensor forward(const torch::Tensor& x);
  /// The embedding whose weight this head reads (ZeRO-3 gathers it for the head too).
  const torch::nn::AnyModule& embedding() const { return embed_; }
  /// The word embedding it reads (the embedding's wte): what a pipeline copies to its last stage.
  const torch::Tensor& weight() const { return *wte_; }
  torch::Tensor matmul_weight() const override { return *wte_; }

private:
  // Shared with the model's "embed" child, deliberately not a child here; wte_ points at its
  // member, which the module (held here too) outlives nothing of.
  torch::nn::AnyModule embed_;
  const torch::Tensor* wte_;
};
TORCH_MODULE(TiedHead);

/// Builds the GPT with every parameter created by `tensors` (device and dtype), then (after
/// torch::manual_seed(seed) again, so construction draws do not matter) initializes in
/// parameters() order: LayerNorm weight 1 and bias 0, every other bias 0, every other weight
/// (wte, wpe, Linear weights) normal(0, 0.02). tests/models/reference_gpt.py does the same in
/// PyTorch. On the meta device there is nothing to initialize and nothing is drawn. Throws
/// std::invalid_argument for bad options.
torch::nn::Sequential build_gpt(const TransformerShape& options, uint64_t seed,
                                const torch::TensorOptions& tensors = {});

/// The GPT's MLP width: options.ffn_hidden, or 4H when it is 0.
int64_t gpt_ffn_hidden(const TransformerShape& options);

/// The GPT's parallel plan for `options` (gpt_plan.cpp): per block q, k, v, mlp.fc
/// column-parallel and attn.out, mlp.proj row-parallel; the head over the vocabulary; each
/// block a pipeline unit and its attn an attention.
ParallelPlan gpt_parallel_plan(const TransformerShape& options);

/// Parameters of the GPT for `options`, with F = gpt_ffn_hidden(options):
/// V*H + S*H + L*(4H^2 + 2HF + F + 9H) + 2H (+ V*H untied head); for F = 4H the block term is
/// 12H^2 + 13H.
int64_t gpt_parameter_count(const TransformerShape& options);

} // namespace meshsim
