// Tensor parallelism, Megatron style: two paired autograd functions (copy_to_region,
// reduce_from_region), column- and row-parallel Linears built on them, and the function that
// applies a model's plan (models/parallel_plan.h: which Linear of an unmodified model becomes
// which, where the vocabulary-parallel head is); optionally with sequence parallelism
// (parallel/tensor/sequence_parallel.h). See docs/tensor-parallel.md.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"
#include "models/layers/slots.h"
#include "models/parallel_plan.h"

namespace meshsim {

/// Megatron's paired functions. copy_to_region: identity forward, all-reduce (sum) of the gradient
/// over `group` in backward. reduce_from_region: all-reduce (sum) forward, identity backward. Both
/// return `x` untouched on a group of one.
torch::Tensor copy_to_region(const torch::Tensor& x, Communicator& comm, const Group& group);
torch::Tensor reduce_from_region(const torch::Tensor& x, Communicator& comm, const Group& group);

/// Megatron's gather: forward all-gathers the members' slices of the last dimension in group
/// order, backward keeps member `index`'s slice of the gradient. `x` itself on a group of one.
torch::Tensor gather_from_region(const torch::Tensor& x, Communicator& comm, const Group& group,
                                 int index);

/// Column-parallel layers under one parent that read the same input (q, k, v) share one
/// copy_to_region, so the input's gradient is all-reduced once, as with Megatron's fused QKV.
class RegionInput;

/// Output features split over the group: weight [out/n, in], bias [out/n]. The input is
/// replicated; the output is this member's slice of features, left sharded. Under sequence
/// parallelism (set by its RegionInput) the input is this member's part of the sequence,
/// all-gathered before the product.
class ColumnParallelLinearImpl : public torch::nn::Module {
public:
  ColumnParallelLinearImpl(torch::Tensor weight, torch::Tensor bias, Communicator& comm,
                           Group group, std::shared_ptr<RegionInput> input);
  torch::Tensor forward(const torch::Tensor& x);
  /// The number of parts of the sequence its input holds one of: the group's size under
  /// sequence parallelism, otherwise 1.
  int64_t sequence_parts() const;
  torch::Tensor weight, bias;

private:
  std::shared_ptr<RegionInput> input_;
};
TORCH_MODULE(ColumnParallelLinear);

/// Input features split over the group: weight [out, in/n], bias [out] replicated. The input
/// is this member's slice of features; the partial products are summed by one all-reduce and
/// the bias is added once, after it. With `sequence_parallel`, the sum is a reduce-scatter
/// instead, leaving this member's part of the sequence, and the bias is added to that part.
class RowParallelLinearImpl : public torch::nn::Module {
public:
  RowParallelLinearImpl(torch::Tensor weight, torch::Tensor bias, Communicator& comm, Group group,
                        bool sequence_parallel = false);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

private:
  Communicator& comm_;
  Group group_;
  bool sequence_parallel_;
};
TORCH_MODULE(RowParallelLinear);

/// The LM head split over the vocabulary (Megatron's ColumnParallelLinear): weight [V/n, h] is
/// this member's rows; each member computes its V/n logits of the replicated input. They are
/// all-gathered whole, [..., V] (evaluation, any reader of the logits), or, with
/// `parallel_output` (Megatron's, set while a strategy trains), left split for
/// vocab_parallel_cross_entropy (parallel/tensor/cross_entropy.h).
class VocabParallelHeadImpl : public torch::nn::Module, public MatmulLeaf {
public:
  VocabParallelHeadImpl(torch::Tensor weight, Communicator& comm, Group group, int index);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor matmul_weight() const override { return weight; }
  torch::Tensor weight;
  bool parallel_output = false;

private:
  Communicator& comm_;
  Group group_;
  int index_;
};
TORCH_MODULE(VocabParallelHead);

/// Replaces, in place, every Linear whose full name matches an entry of plan.linears with a
/// ColumnParallelLinear / RowParallelLinear holding this member's shard (member `index` of
/// `group`), sliced from the full (already initialized) Linear, so the sharded model computes
/// exactly what the full one does. Throws std::invalid_argument if an entry matches nothing or
/// a dimension is not divisible by group.size(). The new shards are allocated under the
/// caller's current GPU and category; the replaced full Linear is released. The Linear's
/// parent must implement LinearSlots (models/layers/slots.h). Nothing is replaced if any check
/// fails. The model's child plan.vocab_head, when it is a
/// Linear of its own (not tied to the embedding) whose vocabulary divides by group.size(),
/// becomes a VocabParallelHead.
///
/// With `sequence_parallel` (Korthikanti et al. 2022), the column layers all-gather their
/// input along the sequence (and reduce-scatter its gradient), the row layers reduce-scatter
/// their output along it, and `model` is rebuilt with two parameter-less children:
/// "sequence_scatter" after plan.sequence_after and "sequence_gather" before
/// plan.sequence_before, so every other child in between runs on this member's part of the
/// sequence (its length must divide by group.size()). Their replicated parameters then get
/// partial gradients: see sequence_parallel_parameters.
void parallelize_tensor(torch::nn::Sequential& model, const ParallelPlan& plan, Communicator& comm,
                        const Group& group, int index, bool sequence_parallel = false);

/// The parameters of a sequence-parallel model (or of a pipeline stage of one) whose gradient
/// each member computes from its part of the sequence only: every parameter of the children
/// other than plan.sequence_after and plan.sequence_before that is not a tensor-parallel shard
/// (normalizations, row-parallel biases). Their gradients must be summed over the group
/// (all_reduce_sequence_parallel_gradients) before the optimizer step.
std::vector<torch::Tensor> sequence_parallel_parameters(const torch::nn::Sequential& model,
                                                        const ParallelPlan& plan);

/// sequence_parts() of the first column-parallel layer in `module` (1 when it has none).
int64_t sequence_parts(const torch::nn::Module& module);

/// Collective over `group`: the full (unsharded) parameters of a tensor-parallel model, in the
/// order of the unsharded model's parameters(), all-gathered and concatenated along each shard's
/// split dimension (replicated parameters returned as they are). Allocated under the caller's
/// current GPU/category.
std::vector<torch::Tensor> full_parameters(torch::nn::Sequential& model, Communicator& comm,
                                           const Group& group);

/// The same for the parameters' gradients (throws std::invalid_argument if one has none).
std::vector<torch::Tensor> full_gradients(torch::nn::Sequential& model, Communicator& comm,
                                          const Group& group);

} // namespace meshsim
