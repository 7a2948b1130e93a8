// The fused causal attention core: softmax(q kᵀ/√d + causal mask) v computed a tile of query
// rows at a time, keeping for backward only q, k, v, the output and one log-sum-exp per row
// (FlashAttention-2's memory: no [B, heads, T, T] scores), and recomputing the scores tile by
// tile in backward. fused_attention() is the building block at explicit query and key
// positions that context parallelism calls for one block of keys and merges by log-sum-exp.
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "models/layers/attention.h"

namespace meshsim {

/// Query rows per tile when fused_attention() is given 0: at most 128, fewer when a tile's
/// scores [B, heads, rows, Tk] would pass kFusedTileScores numbers (2^24: 64 MiB in float32),
/// so that the core's transient memory, one tile's scores and what backward derives from them,
/// stays a few hundred MiB at any sequence length (FlashAttention's stays on chip).
constexpr int64_t kFusedTileRows = 128;
constexpr int64_t kFusedTileScores = int64_t{1} << 24;

/// The query rows per tile fused_attention() runs for `tile_rows` (0: the default above).
int64_t fused_tile_rows(int64_t tile_rows, int64_t batch, int64_t heads, int64_t keys);

struct PartialAttention { torch::Tensor out, lse; };  // out [B,h,Tq,d], lse [B,h,Tq]

/// softmax(q kᵀ/√d, causal by position: query i sees key j when k_positions[j] <= q_positions[i]) v,
/// in query tiles; differentiable in q, k, v, including through lse (d lse/dS = P),
/// so partial results merged by their log-sum-exp backpropagate exactly.
/// A query row that sees no key gets out 0 and lse -inf (and zero gradients).
/// q [B, h, Tq, d], k [B, h, Tk, d] and v [B, h, Tk, dv] (as many heads as q; dv is d but in
/// multi-head latent attention), positions int64 [Tq] and [Tk].
/// lse is float32 for float16/bfloat16 inputs (the softmax runs in float32, as FlashAttention's
/// does), the input's dtype otherwise. out is a transposed view of a [B, Tq, h, d] tensor, so
/// that out.transpose(1, 2).contiguous() (the layout the output projection reads) is the
/// tensor backward keeps, not a copy. On the meta device only the first tile runs (see
/// fused_core.cpp): the shapes, and the memory charged, are those of the whole computation.
/// With `dropout` (p > 0) the probabilities are dropped as the eager core drops them (the same
/// mask, regenerated per tile in forward and in backward, models/layers/dropout.h); out is
/// then P̃ v and lse stays the undropped softmax's, so merged partial outputs are the dropped
/// attention over all their keys.
PartialAttention fused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                 int64_t tile_rows = 0 /* 0: default */,
                                 const AttentionDropout& dropout = {});

/// fused_attention(q, k, v, positions, positions).out as an AttentionCore, with dropout or
/// without.
class FusedCausalCore : public AttentionCore {
public:
  /// `tile_rows`: query rows per tile (0: fused_tile_rows' default).
  explicit FusedCausalCore(int64_t tile_rows = 0) : tile_rows_(tile_rows) {}
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions) const override {
    return fused_attention(q, k, v, positions, positions, tile_rows_).out;
  }
  torch::Tensor forward_with_dropout(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& positions,
                                     const AttentionDropout& dropout) const override {
    return fused_attention(q, k, v, positions, positions, tile_rows_, dropout).out;
  }
  bool fused() const override { return true; }

private:
  int64_t tile_rows_;
};

} // namespace meshsim
