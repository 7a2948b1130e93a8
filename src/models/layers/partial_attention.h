// Attention of queries against one block of keys and values, returning the output and its
// log-sum-exp so that partial outputs over several blocks can be merged exactly (context
// parallelism's ring). This is the plain-ops kernel: separate kernels, keeping the
// [B, heads, Tq, Tk] scores for backward, as the eager core does; context parallelism runs it
// under --attention eager, and the fused kernel (fused_core.h) under --attention fused
// (parallel/context/context_parallel.cpp, block_attention).
#pragma once

#include <torch/torch.h>

#include "models/layers/dropout.h"

namespace meshsim {

/// out [B, heads, Tq, d], lse [B, heads, Tq] (natural log of the row's sum of exp(score)).
struct BlockAttention {
  torch::Tensor out, lse;
};

/// softmax(q kᵀ / √d) v over the keys each query sees, causal by position: query i sees key j
/// when k_positions[j] <= q_positions[i]. q [B, heads, Tq, d]; k, v [B, heads, Tk, d];
/// positions int64 [Tq] and [Tk]. Differentiable in q, k and v, through out and lse. A query
/// that sees no key gets out 0 and lse -inf, and sends no gradient (zero, never NaN).
/// `tile_rows` is the fused kernel's knob; the reference ignores it. With `dropout` (p > 0)
/// the probabilities are dropped (and their mask kept for backward, as the eager core keeps
/// it); lse is the undropped softmax's.
BlockAttention partial_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v,
                                           const torch::Tensor& q_positions,
                                           const torch::Tensor& k_positions,
                                           int64_t tile_rows = 0,
                                           const AttentionDropout& dropout = {});

} // namespace meshsim
