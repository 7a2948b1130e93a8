// ZeroDataParallel: ZeRO stages 0-3 over a data-parallel group (docs/zero.md).
//
// Every stage keeps the parameters as views into flat units (parallel/data/zero_flat.h). What
// differs is what each member keeps of them and which collectives run:
//   stage 0  full grads, all-reduce (avg) per unit after backward, optimizer on everything
//   stage 1  as 0, but the optimizer (and its state) only covers this member's shard; the
//            updated shards are all-gathered back into the full parameters
//   stage 2  gradients reach a unit-sized communication bucket through post-hooks on the
//            parameters' AccumulateGrad nodes, and the bucket's reduce-scatter starts as
//            soon as the unit is complete, during backward, and runs while the next bucket
//            fills (one in flight); only the shard's gradient is kept
//   stage 3  as 2, and the parameters themselves are gathered per block before its forward
//            and its backward and freed after, the next block's gather started before a
//            block computes, as FSDP prefetches (zero_stage3.cpp)
// Stage 1 as Megatron's distributed optimizer reduce-scatters the gradients instead, and the
// next step gathers the updated parameters: zero_grad() starts every unit's gather, each
// block's forward waits for its own (zero_param_gather.cpp).
#include "parallel/data/zero.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "memory/allocator.h"
#include "memory/category.h"
#include "parallel/data/zero_flat.h"
#include "parallel/data/zero_state.h"

namespace meshsim {
namespace {

int64_t bytes_of(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params)
    n += p.numel() * static_cast<int64_t>(p.element_size());
  return n;
}

/// The parameters of each block (a child with parameters), in forward order, as indices into
/// `params` (the model's parameters()).
std::vector<std::vector<size_t>> blocks_of(const torch::nn::Sequential& model,
                                           const std::vector<torch::Tensor>& params) {
  std::unordered_map<const void*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i)
    index.emplace(params[i].unsafeGetTensorImpl(), i);
  std::vector<std::vector<size_t>> blocks;
  size_t count = 0;
  for (const auto& child : model->children()) {
    std::vector<size_t> block;
    for (const auto& p : child->parameters()) {
      if (!p.requires_grad())
        throw std::invalid_argument(
            "zero: frozen parameters (requires_grad false) are not supported");
      block.push_back(index.at(p.unsafeGetTensorImpl()));
    }
    count += block.size();
    if (!block.empty())
      blocks.push_back(std::move(block));
  }
  if (count != params.size())
    throw std::invalid_argument("zero: every parameter must belong to a child of the Sequential");
  if (blocks.empty())
    throw std::invalid_argument("zero: the model has no parameters");
  return blocks;
}

/// Which group each parameter is in; throws for a parameter in none or in two, and for a
/// rank outside one of its groups.
std::vector<size_t> group_of_each(const std::vector<ParamGroup>& groups, size_t params, int rank) {
  if (groups.empty())
    throw std::invalid_argument("zero: no parameter groups");
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> group_of(params, kNone);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].group.index_of(rank) < 0)
      throw std::invalid_argument(fmt::format("zero: rank {} is not in its {} group [{}]", rank,
                                              groups[g].dim, groups[g].group.key()));
    if (groups[g].replicate.size() > 0 && groups[g].replicate.index_of(rank) < 0)
      throw std::invalid_argument(fmt::format("zero: rank {} is not in its {} group [{}]", rank,
                                              groups[g].replicate_dim,
                                              groups[g].replicate.key()));
    for (size_t i : groups[g].params) {
      if (i >= params)
        throw std::invalid_argument(fmt::format(
            "zero: {} group names parameter {} of a model with {}", groups[g].dim, i, params));
      if (group_of[i] != kNone)
        throw std::invalid_argument(fmt::format("zero: parameter {} is in the {} and {} groups", i,
                                                groups[group_of[i]].dim, groups[g].dim));
      group_of[i] = g;
    }
  }
  for (size_t i = 0; i < params; ++i)
    if (group_of[i] == kNone)
      throw std::invalid_argument(fmt::format("zero: parameter {} is in no parameter group", i));
  return group_of;
}

} // namespace

ParamGroup all_parameters(const torch::nn::Sequential& model, Group group, std::string dim) {
  ParamGroup g;
  g.dim = std::move(dim);
  g.group = std::move(group);
  for (size_t i = 0; i < model->parameters().size(); ++i)
    g.params.push_back(i);
  return g;
}

ZeroDataParallel::ZeroDataParallel(RankContext& ctx, torch::nn::Sequential model, Group dp,
                                   ZeroOptions options)
    : ZeroDataParallel(ctx, model, std::vector<ParamGroup>{all_parameters(model, std::move(dp))},
                       options) {}

ZeroDataParallel::ZeroDataParallel(RankContext& ctx, torch::nn::Sequential model,
                                   std::vector<ParamGroup> groups, ZeroOptions options)
    : state_(std::make_unique<State>(ctx)) {
  State& s = *state_;
  if (options.stage < 0 || options.stage > 3)
    throw std::invalid_argument(
        fmt::format("zero: stage must be 0, 1, 2 or 3 (got {})", options.stage));
  if (!(options.bucket_mb > 0))
    throw std::invalid_argument(
        fmt::format("zero: bucket size must be positive (got {} MiB)", options.bucket_mb));
  if (options.distributed_optimizer && options.stage != 1)
    throw std::invalid_argument(fmt::format(
        "zero: the distributed optimizer is stage 1 (got stage {})", options.stage));
  s.options = options;
  s.model = model;
  s.params = model->parameters();
  const std::vector<size_t> group_of = group_of_each(groups, s.params.size(), ctx.rank);
  s.groups = std::move(groups);

  torch::NoGradGuard no_grad;
  s.build_units(blocks_of(model, s.params), group_of);
  if (options.stage < 3) // stage 3 prepared each unit as it built it
    for (auto& unit : s.units)
      s.prepare(*unit);
  std::vector<torch::Tensor> shards_to_update;
  for (auto& unit : s.units)
    shards_to_update.push_back(unit->shard);
  s.optimizer = std::make_unique<Optimizer>(shards_to_update, options.optimizer);
  if (options.stage >= 2 || s.accumulates_in_fp32())
    s.install_gradient_hooks();
  if (options.distributed_optimizer) // every forward gathers what the step before updated
    s.mark_parameters_stale();
  s.wrapped = options.stage == 3                ? s.wrap_blocks()
              : options.distributed_optimizer ? s.wrap_for_param_gathers()
                                                : model;
}

void ZeroDataParallel::State::build_units(const std::vector<std::vector<size_t>>& blocks,
                                          const std::vector<size_t>& group_of) {
  // Units in backward order (last block first), as DDP orders its buckets: stage 3 has one
  // per block and group; stages 0-2 merge consecutive blocks' parameters of one group up to
  // the bucket size (a bigger block is a unit alone). Whole blocks only, so a unit's
  // gradients all arrive before the next's of its group.
  const auto cap = static_cast<int64_t>(options.bucket_mb * kMiB);
  std::vector<std::vector<torch::Tensor>> current(groups.size());
  auto close = [&](size_t g) {
    if (current[g].empty())
      return;
    const int shards = options.stage == 0 ? 1 : groups[g].group.size();
    auto unit = std::make_shared<FlatUnit>(make_flat_unit(std::move(current[g]), shards));
    unit->group = groups[g].group;
    unit->replicate = groups[g].replicate;
    unit->gradient_scale = groups[g].gradient_scale;
    unit->member = unit->group.index_of(ctx.rank);
    units.push_back(std::move(unit));
    current[g].clear();
    // Stage 3 shards and frees each unit before the next is built: a GPU never holds more
    // than its shards and one gathered unit, at construction as in a step (FSDP's
    // fully_shard of a meta-initialized model holds less still: nothing whole).
    if (options.stage == 3)
      prepare(*units.back());
  };
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    std::vector<std::vector<torch::Tensor>> parts(groups.size());
    for (size_t i : *it)
      parts[group_of[i]].push_back(params[i]);
    const size_t first = units.size();
    for (size_t g = 0; g < groups.size(); ++g) {
      if (parts[g].empty())
        continue;
      if (!current[g].empty() && bytes_of(current[g]) + bytes_of(parts[g]) > cap)
        close(g);
      current[g].insert(current[g].end(), parts[g].begin(), parts[g].end());
      if (options.stage == 3)
        close(g);
    }
    if (options.stage == 3) {
      block_units.emplace_back();
      for (size_t u = first; u < units.size(); ++u)
        block_units.back().push_back(units[u].get());
    }
  }
  for (size_t g = 0; g < groups.size(); ++g)
    close(g);
  std::reverse(block_units.begin(), block_units.end()); // forward order
}

ZeroDataParallel::~ZeroDataParallel() = default;

void ZeroDataParallel::State::prepare(FlatUnit& unit) {
  // Members start from their group's first rank's parameters, as DDP does.
  ctx.comm.broadcast(unit.full, unit.group.ranks.front(), unit.group);
  if (unit.replicate.size() > 1) // HSDP: every replica from the first one's values
    ctx.comm.broadcast(unit.full, unit.replicate.ranks.front(), unit.replicate);
  for (auto& p : unit.params)
    p.mutable_grad() = torch::Tensor();
  set_up_gradients(unit);
}

void ZeroDataParallel::State::set_up_gradients(FlatUnit& unit) {
  switch (options.stage) {
  case 0:
  case 1: {
    const bool fp32 = accumulates_in_fp32();
    {
      CategoryScope scope(MemoryCategory::Gradients);
      unit.grad = torch::zeros({unit.padded}, fp32 ? unit.full.options().dtype(torch::kFloat32)
                                                   : unit.full.options());
    }
    // Autograd accumulates into an existing .grad in place, so backward writes straight
    // into the flat gradient, ready for one all-reduce per unit. An fp32 flat gradient of
    // 16-bit parameters cannot be their .grad: each backward's gradients are added into it
    // by the gradient hooks instead (on_gradient), as Megatron adds into its main_grad.
    if (!fp32)
      point_grads_at_flat_gradient(unit);
    unit.shard = options.stage == 0 ? unit.full : shard_of(unit, unit.full, unit.member);
    unit.shard_grad = options.stage == 0 ? unit.grad : shard_of(unit, unit.grad, unit.member);
    break;
  }
  case 2:
    unit.shard = shard_of(unit, unit.full, unit.member);
    break;
  case 3: {
    CategoryScope scope(MemoryCategory::Parameters);
    unit.shard = shard_of(unit, unit.full, unit.member).clone();
    release_full(unit);
    break;
  }
  }
  if (options.stage >= 2) {
    CategoryScope scope(MemoryCategory::Gradients);
    unit.shard_grad = torch::zeros({unit.shard_numel}, unit.full.options());
  }
  unit.shard.mutable_grad() = unit.shard_grad;
}

bool ZeroDataParallel::State::accumulates_in_fp32() const {
  return options.stage <= 1 && options.reduce_fp32 && !params.empty() &&
         is_low_precision(params.front().scalar_type());
}

void ZeroDataParallel::State::install_gradient_hooks() {
  // LibTorch 1.13 has no post-accumulate-grad hook on tensors, and a tensor hook on a leaf
  // runs *before* AccumulateGrad stores the gradient. A post hook on the AccumulateGrad node
  // itself runs after it (what PyTorch's C++ DDP reducer does): .grad is then set, so the
  // hook copies it into the bucket and drops it at once. The parameter only holds a weak
  // reference to its accumulator, so we keep the nodes alive, or the next forward would
  // make new ones without our hooks.
  for (auto& unit : units) {
    for (size_t i = 0; i < unit->params.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(unit->params[i]);
      FlatUnit* u = unit.get();
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, u, i](const torch::autograd::variable_list& outputs,
                       const torch::autograd::variable_list&) {
            on_gradient(*u, i);
            return outputs;
          }));
      accumulators.push_back(std::move(accumulator));
    }
  }
}

void ZeroDataParallel::State::on_gradient(FlatUnit& unit, size_t i) {
  torch::NoGradGuard no_grad;
  torch::Tensor& p = unit.params[i];
  if (!p.grad().defined())
    return;
  if (options.stage <= 1) { // accumulates_in_fp32: the 16-bit gradient added into the fp32 one
    if (p.grad().scalar_type() == unit.grad.scalar_type())
      return; // the view show_fp32_gradients left, which autograd has accumulated into
    unit.grad.narrow(0, unit.offsets[i], p.numel()).add_(p.grad().reshape({-1}));
    p.mutable_grad() = torch::Tensor();
    return;
  }
  if (&unit == in_flight.unit) // the next backward pass reached a unit still being sent
    wait_in_flight();
  if (!unit.bucket.defined()) {
    CategoryScope scope(MemoryCategory::Communication);
    const bool widen = options.reduce_fp32 && is_low_precision(unit.full.scalar_type());
    unit.bucket = torch::zeros({unit.padded}, widen ? unit.full.options().dtype(torch::kFloat32)
                                                    : unit.full.options()); // zero padding
    unit.pending = static_cast<int>(unit.params.size());
  }
  unit.bucket.narrow(0, unit.offsets[i], p.numel()).copy_(p.grad().reshape({-1}));
  p.mutable_grad() = torch::Tensor(); // autograd's gradient (activations) is freed here
  if (--unit.pending == 0)
    reduce_scatter(unit);
}

void ZeroDataParallel::State::reduce_scatter(FlatUnit& unit) {
  torch::NoGradGuard no_grad;
  if (options.stage >= 2 && options.overlap) {
    if (options.stage == 3) // the reduce-scatter reads the bucket, not the parameters
      release(unit);
    wait_in_flight();
    in_flight.part = reduce_scatter_output(unit.bucket, unit.group.size());
    // Avg: each backward pass adds its group average, so micro-batches sum, then average.
    in_flight.work =
        ctx.comm.reduce_scatter_async(unit.bucket, in_flight.part, ReduceOp::Avg, unit.group);
    in_flight.unit = &unit;
    unit.pending = 0;
    return;
  }
  torch::Tensor part = ctx.comm.reduce_scatter(unit.bucket, ReduceOp::Avg, unit.group);
  average_over_replicas(unit, part);
  unit.shard_grad.add_(part);
  ctx.sample_memory(step, "reduce_scatter");
  part = torch::Tensor();
  unit.bucket = torch::Tensor();
  unit.pending = 0;
  if (options.stage == 3)
    release(unit);
}

void ZeroDataParallel::State::wait_in_flight() {
  if (!in_flight.unit)
    return;
  torch::NoGradGuard no_grad;
  InFlight done = std::move(in_flight);
  in_flight = InFlight{};
  done.work->wait();
  average_over_replicas(*done.unit, done.part);
  done.unit->shard_grad.add_(done.part);
  ctx.sample_memory(step, "reduce_scatter");
  done.unit->bucket = torch::Tensor();
}

void ZeroDataParallel::State::average_over_replicas(FlatUnit& unit, torch::Tensor& t) {
  // HSDP: the group's average, then the replicas' (equal sizes: the average of all of dp);
  // then the group's scale (expert parallelism's experts).
  if (unit.replicate.size() > 1)
    ctx.comm.all_reduce(t, ReduceOp::Avg, unit.replicate);
  if (unit.gradient_scale != 1)
    t.mul_(unit.gradient_scale);
}

torch::nn::Sequential ZeroDataParallel::module() {
  return state_->wrapped;
}

void ZeroDataParallel::zero_grad() {
  torch::NoGradGuard no_grad;
  state_->wait_in_flight();
  state_->start_param_gathers(); // the distributed optimizer's: waited for by each block
  const bool fp32 = state_->accumulates_in_fp32();
  for (auto& unit : state_->units) {
    unit->shard_grad.zero_();
    if (unit->grad.defined())
      unit->grad.zero_();
    if (fp32) // backward's 16-bit .grad goes to the hooks again
      for (auto& p : unit->params)
        p.mutable_grad() = torch::Tensor();
  }
}

void ZeroDataParallel::State::show_fp32_gradients() {
  if (!accumulates_in_fp32())
    return;
  for (auto& unit : units)
    point_grads_at_flat_gradient(*unit);
}

void ZeroDataParallel::State::point_grads_at_flat_gradient(FlatUnit& unit) {
  for (size_t i = 0; i < unit.params.size(); ++i) {
    torch::Tensor& p = unit.params[i];
    p.mutable_grad() = unit.grad.narrow(0, unit.offsets[i], p.numel()).view(p.sizes());
  }
}

void ZeroDataParallel::finish_gradients(int64_t step) {
  State& s = *state_;
  torch::NoGradGuard no_grad;
  s.step = step;
  if (s.options.distributed_optimizer) {
    for (auto& unit : s.units) {
      torch::Tensor part = s.ctx.comm.reduce_scatter(unit->grad, ReduceOp::Avg, unit->group);
      s.average_over_replicas(*unit, part);
      unit->shard_grad.copy_(part);
    }
    s.show_fp32_gradients();
    s.ctx.sample_memory(step, "reduce_scatter");
    return;
  }
  if (s.options.stage <= 1) {
    for (auto& unit : s.units) {
      s.ctx.comm.all_reduce(unit->grad, ReduceOp::Avg, unit->group);
      s.average_over_replicas(*unit, unit->grad);
    }
    s.show_fp32_gradients();
    s.ctx.sample_memory(step, "all_reduce");
    return;
  }
  // A unit some of whose parameters got no gradient in this backward is still waiting:
  // the missing gradients count as zero (every member has the same graph, so the same
  // units are waiting on all of them and the collectives still match).
  for (auto& unit : s.units)
    if (unit->bucket.defined() && unit.get() != s.in_flight.unit)
      s.reduce_scatter(*unit);
  s.wait_in_flight();
}

void ZeroDataParallel::step(int64_t step, bool grads_finite) {
  State& s = *state_;
  // The caller (the mesh engine) records the step's compute region around this call, with
  // the update's counted work; the all-gathers below fall inside it.
  s.wait_in_flight(); // finish_gradients has waited already, unless the caller skipped it
  s.finish_param_gathers(); // none is left by a whole forward; the step writes the shards
  const bool stepped = s.optimizer->step(grads_finite);
  s.ctx.sample_memory(step, "optimizer");
  if (stepped && s.options.distributed_optimizer) { // gathered by the next step
    s.mark_parameters_stale();
  } else if (stepped && (s.options.stage == 1 || s.options.stage == 2)) {
    for (auto& unit : s.units)
      all_gather_into_full(*unit, s.ctx.comm, unit->group);
    s.ctx.sample_memory(step, "all_gather");
  }
  s.step = step + 1;
}

Optimizer* ZeroDataParallel::optimizer() {
  return state_->optimizer.get();
}
int ZeroDataParallel::stage() const {
  return state_->options.stage;
}

void ZeroDataParallel::save(torch::serialize::OutputArchive& archive) const {
  const State& s = *state_;
  // A clone, so that a shard that is a view writes its own elements, not the whole buffer.
  for (size_t i = 0; i < s.units.size(); ++i)
    archive.write(fmt::format("zero/shard/{}", i), s.units[i]->shard.detach().clone());
  s.optimizer->save(archive);
}

void ZeroDataParallel::load(torch::serialize::InputArchive& archive) {
  State& s = *state_;
  s.finish_param_gathers(); // none may be in flight while the shards are overwritten
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < s.units.size(); ++i) {
    torch::Tensor t;  // fresh each time: read() into a defined tensor re-points it (set_)
    archive.read(fmt::format("zero/shard/{}", i), t);
    FlatUnit& unit = *s.units[i];
    if (!t.sizes().equals(unit.shard.sizes()))
      throw std::runtime_error(fmt::format("flat buffer {} has {} elements in the checkpoint, {} here",
                                           i, t.numel(), unit.shard.numel()));
    unit.shard.copy_(t);
  }
  s.optimizer->load(archive);
  if (s.options.stage == 1 || s.options.stage == 2)  // the full parameters from the shards
    for (auto& unit : s.units)
      all_gather_into_full(*unit, s.ctx.comm, unit->group);
  s.stale.clear();
}

int64_t ZeroDataParallel::flat_bytes() const {
  int64_t n = 0;
  for (const auto& unit : state_->units)
    n += unit->bytes();
  return n;
}

int64_t ZeroDataParallel::largest_unit_bytes() const {
  int64_t n = 0;
  for (const auto& unit : state_->units)
    n = std::max(n, unit->bytes());
  return n;
}

} // namespace meshsim
