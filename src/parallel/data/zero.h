// ZeRO stages 0-3: data parallelism that reduces each parameter's gradients over a group and
// shards, stage by stage, the optimizer state (1), the gradients (2) and the parameters (3)
// over its members, as DeepSpeed ZeRO and PyTorch FSDP do. Parameters come in groups, each
// with its own process group (ParamGroup): today every parameter is in one over "dp_cp"; an
// MoE's experts would be another over "edp". See docs/zero.md for the memory each stage
// holds, what is counted where, and the collectives of a step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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
  bool overlap = true;   // stage 2: a unit's reduce-scatter runs while backward fills the next
};

/// Parameters whose gradients are averaged, and whose state is sharded, over one group.
struct ParamGroup {
  std::string dim = "dp_cp";  // its ParallelDims group's name (mesh/parallel_dims.h): messages
  Group group;                // this rank's group of that name
  std::vector<size_t> params; // indices into the model's parameters()
};

/// One group over `group` holding every parameter of `model`.
ParamGroup all_parameters(const torch::nn::Sequential& model, Group group,
                          std::string dim = "dp_cp");

struct FlatUnit;

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
  /// member's shard for 2 and 3).
  void finish_gradients(int64_t step);
  /// Optimizer step (on the shard for stages >= 1; then updated parameters all-gathered for
  /// stages 1 and 2). `grads_finite` false (fp16 overflow, agreed by every member) skips it:
  /// nothing changes and nothing is gathered.
  void step(int64_t step, bool grads_finite = true);
  /// Collective over the groups: the full parameters in module().parameters() order of the
  /// unwrapped model (stage 3 gathers them); allocated under the caller's current GPU/category.
  std::vector<torch::Tensor> full_parameters();
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
