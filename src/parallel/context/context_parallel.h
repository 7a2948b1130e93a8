// Context parallelism (--cp C): the sequence is cut into 2C chunks and rank r of a cp group
// holds chunks r and 2C-1-r (the causal load balance of Megatron-LM and torchtitan), so every
// rank has the same share of the causal attention's work. Everything but attention is
// per token and runs on the rank's tokens alone; attention needs the keys and values of
// the tokens before each query, which the two cores here bring from the other ranks:
//
//  - ring: the K/V blocks go round the group by isend/irecv, each step's exchange
//    overlapped with the attention of the block in hand; the partial outputs are merged by
//    their log-sum-exp. Backward goes round again, recomputing each block's attention, and
//    the dK/dV of a block travel with it back to its owner.
//  - allgather: K and V are all-gathered over the group before attention, and their
//    gradients reduce-scattered back in backward (Llama 3's choice).
//
// Both exchange K and V with their own heads (grouped-query attention repeats them after).
// See docs/context-parallel.md.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"
#include "models/layers/attention.h"
#include "models/layers/partial_attention.h"
#include "models/parallel_plan.h"

namespace meshsim {

/// The --cp-comm choices: "allgather" (the default) and "ring".
const std::vector<std::string>& cp_comm_names();

/// The positions (int64 [seq_len / cp]) of the tokens cp rank `index` holds: chunk `index`
/// then chunk 2·cp-1-`index` of the 2·cp chunks of a sequence of `seq_len` tokens.
torch::Tensor cp_positions(int64_t seq_len, int cp, int index, const torch::TensorOptions& options);

/// x [B, T, ...] -> [B, T / cp, ...]: the tokens at cp_positions(T, cp, index).
/// std::invalid_argument when T does not divide by 2·cp.
torch::Tensor cp_shard_sequence(const torch::Tensor& x, int cp, int index);

/// Attention of q [B, heads, Tq, d] against one block of keys and values with kv heads
/// (repeated here to q's heads), causal by position, with its log-sum-exp: the one call of the
/// partial attention kernel that both cores make. `fused`: the fused kernel
/// (models/layers/fused_core.h, --attention fused), which keeps no scores for backward;
/// otherwise the plain-ops one (partial_attention.h, --attention eager), which keeps them.
/// `dropout`: on the probabilities, with the mask of these queries and keys (so the merged
/// blocks drop exactly what one device's attention drops).
BlockAttention block_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& q_positions,
                               const torch::Tensor& k_positions, bool fused,
                               const AttentionDropout& dropout = {});

/// What both cores share: the cp group, this rank's index in it, and the layout of the
/// others' chunks. Their forward takes k and v with their own kv heads.
class ContextParallelCore : public AttentionCore {
public:
  /// `fused`: each block's attention runs the fused kernel (see block_attention).
  ContextParallelCore(Communicator& comm, Group group, bool fused);
  bool takes_grouped_kv() const override { return true; }
  bool fused() const override { return fused_; }
  /// block_attention with this core's kernel.
  BlockAttention block(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                       const AttentionDropout& dropout) const {
    return block_attention(q, k, v, q_positions, k_positions, fused_, dropout);
  }
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions) const final {
    return forward_with_dropout(q, k, v, positions, {});
  }
  int64_t context_parts() const override { return group_.size(); }
  Communicator& comm() const { return comm_; }
  const Group& group() const { return group_; }
  int index() const { return index_; }

private:
  Communicator& comm_;
  Group group_;
  int index_;
  bool fused_;
};

/// On meta the ring runs the first step of each kind and counts the charges of the others
/// (ring_attention.cpp). While one of these lives, every ring in the process runs every step,
/// as on a CPU: tests hold the two plans equal.
class RingRunsEveryStep {
public:
  RingRunsEveryStep();
  ~RingRunsEveryStep();
  RingRunsEveryStep(const RingRunsEveryStep&) = delete;
  RingRunsEveryStep& operator=(const RingRunsEveryStep&) = delete;
};

class RingAttentionCore final : public ContextParallelCore {
public:
  using ContextParallelCore::ContextParallelCore;
  torch::Tensor forward_with_dropout(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& positions,
                                     const AttentionDropout& dropout) const override;
  /// Its forward merges the blocks' outputs in place: op-level recomputation runs it again
  /// rather than keep them (AttentionImpl::run_core keeps nothing of it).
  bool kept_under_op() const override { return false; }
};

class AllGatherAttentionCore final : public ContextParallelCore {
public:
  using ContextParallelCore::ContextParallelCore;
  torch::Tensor forward_with_dropout(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& positions,
                                     const AttentionDropout& dropout) const override;
};

/// Gives every attention module of plan.attention that `model` holds the core `cp_comm`
/// ("ring" or "allgather") over `group`, its blocks fused or not (`fused`). Throws
/// std::invalid_argument for another name or when the model holds none of them.
void parallelize_context(torch::nn::Sequential& model, const ParallelPlan& plan,
                         Communicator& comm, const Group& group, const std::string& cp_comm,
                         bool fused);

} // namespace meshsim
