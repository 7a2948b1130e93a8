// Sequence parallelism (Korthikanti et al. 2022, Megatron's `mappings.py`): with tensor
// parallelism, the parts of a transformer outside its column- and row-parallel layers
// (normalizations, residual adds) run on 1/t of the sequence on each of the t members, so
// their activations are split too. Four paired autograd functions move a [B, T, ...] tensor
// between the replicated, sequence-split and tensor-split regions along dimension 1; member i
// of the group holds sequence positions [i·T/t, (i+1)·T/t). See docs/tensor-parallel.md.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

/// Replicated -> sequence-split (after the embedding): this member's part of the sequence
/// forward (a copy, so the whole input is not kept alive); all-gather of the gradient backward.
torch::Tensor scatter_to_sequence_region(const torch::Tensor& x, Communicator& comm,
                                         const Group& group);

/// Sequence-split -> replicated (before the head, which every member computes whole):
/// all-gather forward; this member's part of the gradient backward (every member's gradient
/// is the whole one).
torch::Tensor gather_from_sequence_region(const torch::Tensor& x, Communicator& comm,
                                          const Group& group);

/// Sequence-split -> the input of column-parallel layers: all-gather forward; reduce-scatter
/// (sum) of the gradient backward, since each member's shard contributes part of it.
torch::Tensor gather_to_tensor_region(const torch::Tensor& x, Communicator& comm,
                                      const Group& group);

/// A row-parallel layer's partial products -> sequence-split: reduce-scatter (sum) forward;
/// all-gather of the gradient backward.
torch::Tensor reduce_scatter_to_sequence_region(const torch::Tensor& x, Communicator& comm,
                                                const Group& group);

/// Collectives over `group` along dimension 1, no autograd: [B, T/n, ...] from every member
/// -> [B, T, ...] (allocated under the caller's category); and [B, T, ...] summed over the
/// members -> this member's [B, T/n, ...]. Both return `x` on a group of one.
torch::Tensor all_gather_sequence(const torch::Tensor& x, Communicator& comm, const Group& group);
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, Communicator& comm,
                                      const Group& group);

/// The whole input of column-parallel layers that read the same gathered input (q, k, v),
/// gathered again in backward for their weights' gradients, once for all of them: the first
/// layer's backward all-gathers it, the others reuse it, the last releases it.
class SequenceRegather {
public:
  SequenceRegather(Communicator& comm, Group group, int consumers);
  /// `chunk`'s whole sequence; `chunk` must be the tensor the layers' forward gathered.
  torch::Tensor get(const torch::Tensor& chunk);

private:
  Communicator& comm_;
  Group group_;
  int consumers_;
  int uses_left_ = 0;
  torch::Tensor chunk_, full_;
};

/// linear(full, weight, bias) where `full` = gather_to_tensor_region(chunk), keeping only
/// `chunk` (this member's part of the sequence) for backward instead of `full`, as Megatron's
/// sequence-parallel column layer does: the weight's gradient reads `regather.get(chunk)`.
/// The gradient of `full` goes back through the gather (one reduce-scatter for all layers
/// sharing it). `bias` may be undefined.
torch::Tensor gathered_linear(const torch::Tensor& full, const torch::Tensor& chunk,
                              const torch::Tensor& weight, const torch::Tensor& bias,
                              SequenceRegather& regather);

/// Parameter-less children a sequence-parallel model gains (parallelize_tensor): one after
/// its embedding (scatter_to_sequence_region), one before its head
/// (gather_from_sequence_region).
class SequenceScatterImpl : public torch::nn::Module {
public:
  SequenceScatterImpl(Communicator& comm, Group group) : comm_(comm), group_(std::move(group)) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return scatter_to_sequence_region(x, comm_, group_);
  }

private:
  Communicator& comm_;
  Group group_;
};
TORCH_MODULE(SequenceScatter);

class SequenceGatherImpl : public torch::nn::Module {
public:
  SequenceGatherImpl(Communicator& comm, Group group) : comm_(comm), group_(std::move(group)) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return gather_from_sequence_region(x, comm_, group_);
  }

private:
  Communicator& comm_;
  Group group_;
};
TORCH_MODULE(SequenceGather);

/// Sums the gradients of `params` over `group` in one all-reduce of a flat buffer (charged
/// as communication), as Megatron does for its sequence-parallel parameters: a normalization
/// or a row-parallel bias in the sequence-split region sees only this member's part of the
/// sequence, so its gradient is partial. Collective over `group`; nothing on a group of one.
/// Throws std::invalid_argument for a parameter without a gradient.
void all_reduce_sequence_parallel_gradients(const std::vector<torch::Tensor>& params,
                                            Communicator& comm, const Group& group);

} // namespace meshsim
