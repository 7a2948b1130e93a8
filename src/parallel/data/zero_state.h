// The state behind ZeroDataParallel, shared by zero.cpp (stages 0-2, gradient hooks, step)
// and zero_stage3.cpp (the block wrappers that gather and free parameters). Internal.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/torch.h>

#include "parallel/data/zero.h"
#include "parallel/data/zero_flat.h"

namespace torch::autograd {
struct Node;
}

namespace meshsim {

struct ZeroDataParallel::State {
  explicit State(RankContext& context) : ctx(context) {}

  RankContext& ctx;
  std::vector<ParamGroup> groups; // each unit's group is one of these
  ZeroOptions options;
  torch::nn::Sequential model;       // as given (its parameters are views into the units)
  torch::nn::Sequential wrapped;     // what module() returns: `model`, or stage 3's wrappers
  std::vector<torch::Tensor> params; // model->parameters() order
  std::vector<std::shared_ptr<FlatUnit>> units; // backward order: last block first
  std::vector<std::vector<FlatUnit*>> block_units; // stage 3: each block's units, forward order
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators; // keep hooks alive
  std::unique_ptr<Optimizer> optimizer;
  int64_t step = 1; // the step the current backward belongs to (memory samples)

  /// Stages 2 and 3: the unit whose reduce-scatter runs while backward fills the next bucket.
  /// At most one is in flight, as DeepSpeed's double-buffered gradient buckets (overlap_comm):
  /// a second completed unit first waits for it.
  struct InFlight {
    FlatUnit* unit = nullptr;
    std::unique_ptr<Work> work;
    torch::Tensor part; // its reduce-scattered shard, under communication
  };
  InFlight in_flight;

  /// Fills `units` (and, for stage 3, `block_units`) from the model's blocks (parameter
  /// indices, forward order) and each parameter's group.
  void build_units(const std::vector<std::vector<size_t>>& blocks,
                   const std::vector<size_t>& group_of);
  /// A new unit: broadcast from its group's first rank (and its replicas'), then its
  /// gradients set up (stage 3: its shard kept and its full parameters freed).
  void prepare(FlatUnit& unit);
  void set_up_gradients(FlatUnit& unit);
  /// Stages 0 and 1 with ZeroOptions::reduce_fp32 and 16-bit parameters: the flat gradient
  /// is fp32, filled by the gradient hooks, not autograd's .grad.
  bool accumulates_in_fp32() const;
  /// With accumulates_in_fp32, after the reduction: each parameter's .grad is its fp32 view
  /// of the flat gradient, for what reads .grad next (sequence parallelism's sum over tp, a
  /// tied embedding's over its stages); zero_grad() takes the views away again.
  void show_fp32_gradients();
  /// Stages 0, 1: each parameter's .grad is its view of the unit's flat gradient.
  void point_grads_at_flat_gradient(FlatUnit& unit);
  void install_gradient_hooks();
  /// Post-AccumulateGrad hook body: parameter `i` of `unit` has its gradient.
  void on_gradient(FlatUnit& unit, size_t i);
  /// Reduce-scatters (average) the unit's bucket into its shard gradient; frees the bucket,
  /// and for stage 3 the gathered parameters. With ZeroOptions::overlap, stages 2 and 3 only
  /// start it (after waiting for the one in flight); wait_in_flight() finishes it.
  void reduce_scatter(FlatUnit& unit);
  /// Stages 2 and 3: waits for the reduce-scatter in flight, if any, adds its part into the shard
  /// gradient and frees its bucket.
  void wait_in_flight();
  /// HSDP: averages `t` (a unit's gradient, or its reduce-scattered shard) over the unit's
  /// replicas; nothing without replication.
  void average_over_replicas(FlatUnit& unit, torch::Tensor& t);
  /// Stage 3: materializes the unit's full parameters if they are not: waits for the gather
  /// prefetch() started, or gathers them now.
  void gather(FlatUnit& unit);
  /// Stage 3, FSDP's prefetch: gives the unit's `full` storage and starts its all-gather into
  /// it (`param_gathers`), unless it is materialized already or on its way.
  void prefetch(FlatUnit& unit);
  /// Stage 3: frees the unit's full parameters, after the gather in flight into them if any.
  void release(FlatUnit& unit);
  /// Stage 3: a copy of `model` whose blocks gather their parameters around forward and
  /// backward, each starting the next block's gather (forward order in forward, backward
  /// order in backward) before it computes.
  torch::nn::Sequential wrap_blocks();

  /// The distributed optimizer (zero_param_gather.cpp): the units whose full parameters are
  /// behind their shard. `param_gathers`: the all-gathers in flight into units' `full` (the
  /// distributed optimizer's, in place; stage 3's prefetches).
  std::unordered_set<const FlatUnit*> stale;
  std::unordered_map<const FlatUnit*, std::unique_ptr<Work>> param_gathers;
  /// Starts the all-gather of a stale unit's shards (no-op when it is not stale or started).
  void start_param_gather(FlatUnit& unit);
  /// Waits for the unit's all-gather (starting it first if need be) and writes its full
  /// parameters; no-op when it is not stale.
  void finish_param_gather(FlatUnit& unit);
  /// Finishes every stale unit's, in forward order, and every gather stage 3 prefetched.
  void finish_param_gathers();
  /// Starts every stale unit's, in forward order (a step's start).
  void start_param_gathers();
  /// Every unit's full parameters are behind its shard (built, or the optimizer stepped).
  void mark_parameters_stale();
  /// A copy of `model` whose children with parameters finish their units' gathers before
  /// their forward and start the next such child's.
  torch::nn::Sequential wrap_for_param_gathers();
};

} // namespace meshsim
