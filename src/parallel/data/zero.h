// ZeRO stages 0-3: data parallelism that reduces each parameter's gradients over a group and
// shards, stage by stage, the optimizer state (1), the gradients (2) and the parameters (3)
// over its members, as DeepSpeed ZeRO and PyTorch FSDP do. Parameters come in groups, each
// with its own process group (ParamGroup): today every parameter is in one over "dp_cp"; an
// MoE's experts would be another over "edp". See docs/zero.md for the memory each stage
// holds, what is counted where, and the collectives of a step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"
#include "mesh/rank_runner.h"
#include "optim/optimizer.h"

namespace meshsim {

struct ZeroOptions {
  int stage = 0;         // 0, 1, 2 or 3
  double bucket_mb = 25; // stages 0-2: blocks are grouped into flat buckets of about this size
  OptimizerOptions optimizer;
  bool overlap = true;   // stages 2, 3: a unit's reduce-scatter runs while backward fills the next
  /// Stage 1 as Megatron-LM's distributed optimizer (--use-distributed-optimizer with
  /// --overlap-grad-reduce and --overlap-param-gather): after backward each unit's gradients
  /// are reduce-scattered, not all-reduced (only this member's shard of .grad is averaged;
  /// the rest keeps its local sum), and the parameters the optimizer step updated are
  /// all-gathered in place by the next step: zero_grad() starts every unit's gather (as
  /// Megatron's --align-param-gather starts a chunk's at the schedule's start) and each
  /// block's forward waits for its own; a forward outside a step starts its block's and the
  /// next block's. The first step gathers too (the values are the same on every member), so
  /// that every step runs alike; reading the full parameters (full_parameters,
  /// with_full_parameters) finishes the gathers first.
  bool distributed_optimizer = false;
  /// Stage 3, FSDP2's reshard_after_forward: free a block's gathered parameters after its
  /// forward (true), or keep them until its backward has reduce-scattered its gradients
  /// (false: one all-gather less per block and micro-batch, the gathered blocks held from
  /// forward to backward). Forwards without autograd (evaluation) always free them.
  bool reshard_after_forward = true;
  /// 16-bit gradients reduced in fp32. Stages 2, 3 (FSDP2's MixedPrecisionPolicy with
  /// reduce_dtype=float32, as torchtitan and NeMo AutoModel run it): each unit's bucket is
  /// fp32, the gradients cast into it, and the averaged part added to the 16-bit shard.
  /// Stages 0, 1 (Megatron's bf16 default, its main_grad; the distributed optimizer
  /// included): the flat gradient itself is fp32, 4 bytes a parameter, each backward's
  /// gradients added into it (micro-batches accumulate in fp32), all-reduced or
  /// reduce-scattered in fp32, and the optimizer reads fp32 gradients; after
  /// finish_gradients each parameter's .grad is its fp32 view of the flat gradient.
  bool reduce_fp32 = false;
  /// Stage 3: children without parameters that read another child's parameters, as
  /// {reader, owner} child indices of the Sequential (a tied LM head reading the embedding's
  /// weight, as FSDP puts a shared weight in one unit): the reader is wrapped like a block
  /// with the owner's units, gathered for its forward and backward.
  std::vector<std::pair<size_t, size_t>> shared_children{};
};

/// Parameters whose gradients are averaged, and whose state is sharded, over one group.
struct ParamGroup {
  std::string dim = "dp_cp";  // its ParallelDims group's name (mesh/parallel_dims.h): messages
  Group group;                // this rank's group of that name
  std::vector<size_t> params; // indices into the model's parameters()
  /// HSDP: the ranks holding the same shard in the other replicas ("dp_replicate"): the
  /// gradients reduced (or reduce-scattered) over `group` are then averaged over these. Empty
  /// or one rank: no replication.
  Group replicate{};
  std::string replicate_dim = "dp_replicate";
  /// The averaged gradients are multiplied by this: expert parallelism's experts, averaged
  /// over edp, take 1/ep to be averaged over dp × cp (parallel/expert/expert_parallel.h).
  double gradient_scale = 1;
};

/// One group over `group` holding every parameter of `model`.
ParamGroup all_parameters(const torch::nn::Sequential& model, Group group,
                          std::string dim = "dp_cp");

struct FlatUnit;

/// A child of the model ZeRO wrapped (stage 3's gathers around forward and backward, the
/// distributed optimizer's before forward): the module it runs. Counting a layer's work reads
/// the module itself, not the wrapper.
class ZeroWrapper : public torch::nn::Module {
public:
  const torch::nn::Module& inner() const { return *inner_.ptr(); }

protected:
  explicit ZeroWrapper(torch::nn::AnyModule inner) : inner_(std::move(inner)) {
    register_module("block", inner_.ptr());
  }
  torch::nn::AnyModule inner_;
};

/// `m`, or the module a ZeroWrapper `m` runs.
inline const torch::nn::Module& unwrapped(const torch::nn::Module& m) {
  const auto* wrapper = dynamic_cast<const ZeroWrapper*>(&m);
  return wrapper ? wrapper->inner() : m;
}

/// Data parallelism over `dp` for this rank's part of the model, with ZeRO stage 0 (plain DDP:
/// full params, grads, optimizer state; bucketed all-reduce average), 1 (optimizer state
/// sharded), 2 (gradients sharded too: reduce-scatter during backward), 3 (parameters sharded
/// too: all-gathered per block before use and freed after, as FSDP does).
///
/// Parameters are grouped by block (a child of the Sequential that has parameters) and by
/// parameter group into flat buffers, each padded with zeros to a multiple of its group's
/// size; member i of the group owns the contiguous i-th 1/size of the buffer.
class ZeroDataParallel {
public:
  /// `model`'s parameters are already initialized and allocated on this rank's GPU under
  /// `parameters`; they are broadcast from dp.ranks[0] so every member starts identical.
  /// Collective over dp. Throws std::invalid_argument for a bad stage, bucket size or group.
  ZeroDataParallel(RankContext& ctx, torch::nn::Sequential model, Group dp, ZeroOptions options);
  /// The same with each parameter reduced and sharded over its group's members (every
  /// parameter in exactly one group; broadcast from each group's first rank). Collective over
  /// every group. Throws std::invalid_argument for a parameter in no group or in two.
  ZeroDataParallel(RankContext& ctx, torch::nn::Sequential model, std::vector<ParamGroup> groups,
                   ZeroOptions options);
  ~ZeroDataParallel();
  ZeroDataParallel(const ZeroDataParallel&) = delete;
  ZeroDataParallel& operator=(const ZeroDataParallel&) = delete;

  /// The module to run forward/backward on. Stage 3 wraps every block so that its
  /// parameters are gathered for its forward and backward and freed in between; outside
  /// those windows the stage-3 parameter tensors have no storage (use full_parameters()).
  /// Valid while this object lives.
  torch::nn::Sequential module();
  void zero_grad();
  /// After all of the step's backward passes (there may be several: micro-batches): the
  /// gradients end averaged over their group (full on every member for stages 0 and 1, this
  /// member's shard for 2 and 3, and for the distributed optimizer the part of .grad in
  /// this member's shard).
  void finish_gradients(int64_t step);
  /// Optimizer step (on the shard for stages >= 1; then updated parameters all-gathered for
  /// stages 1 and 2, or by the next step for the distributed optimizer). `grads_finite` false
  /// (fp16 overflow, agreed by every member) skips it: nothing changes and nothing is gathered.
  void step(int64_t step, bool grads_finite = true);
  /// Collective over the groups: the full parameters in module().parameters() order of the
  /// unwrapped model (stage 3 gathers them); allocated under the caller's current GPU/category.
  std::vector<torch::Tensor> full_parameters();
  /// Collective over the groups: runs `read` while every unit's full parameters have storage
  /// (stage 3 gathers the units that are not, and frees them again after), so that code
  /// reading module() parameters directly (tensor parallel's gather) sees their values.
  /// Tensors `read` keeps must be copies.
  void with_full_parameters(const std::function<void()>& read);
  /// After finish_gradients, for stages 2 and 3: the part of each of `params` (parameters
  /// of the model) that lies in this member's gradient shard, as views of the shard's
  /// gradient (empty views where a parameter lies outside it). Members of different groups
  /// with the same unit layout get views of the same sizes. Throws std::invalid_argument for
  /// a tensor that is not a parameter of the model, or for stages 0 and 1 (use .grad).
  std::vector<torch::Tensor> shard_gradients_of(const std::vector<torch::Tensor>& params);
  Optimizer* optimizer();
  int stage() const;

  /// This member's part of the training state: its shard of every flat buffer, and the
  /// optimizer state over them. load() is collective over the groups (stages 1 and 2 all-gather the
  /// full parameters from the shards) and throws std::runtime_error when a shard's size
  /// differs from this layout's.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

  /// Bytes of all flat buffers (padded, whole model), and of the largest one (a bucket for
  /// stages 0-2, a block for stage 3): the transient bounds in docs/zero.md are in these.
  int64_t flat_bytes() const;
  int64_t largest_unit_bytes() const;

private:
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace meshsim
