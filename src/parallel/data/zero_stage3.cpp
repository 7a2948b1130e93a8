// ZeRO stage 3 / FSDP: each block with parameters is wrapped so that its flat units (one per
// parameter group it has parameters in) are all-gathered just before its forward and freed
// right after; a hook on the gradient of the block's output gathers them again just before
// the block's backward runs, and the gradient hooks (zero.cpp) reduce-scatter a unit's
// gradients and free it once they have all arrived. As FSDP prefetches, a block whose
// parameters are there starts the gather of the next block's (forward order in forward,
// backward order in backward) before it computes: that gather runs beside its compute, and
// the next block waits only for what is left of it. Two blocks' parameters are then gathered
// at once in forward, up to three in backward (State::gather, prefetch and release, below).
//
// Freeing swaps the storage's DataPtr for an empty one (zero_flat.cpp), so the parameter
// tensors, and the references autograd saved to them (weights for the input gradient),
// stay valid and see the regathered values: no recomputation is needed. The parameters'
// own version counters are untouched (the data is written through the flat tensor), and
// the values written back are bitwise the ones used in forward.
//
// Without reshard_after_forward (FSDP2's option) a block keeps its gathered parameters from
// its forward to the end of its backward, where the gradient hook frees them: the gather
// before backward finds them there. A child without parameters that reads another's (a tied
// head, ZeroOptions::shared_children) is wrapped with the owner's units: the owner's weight
// is gathered for the reader's forward and before its backward, and the owner's gradients
// (the reader's and its own, summed by autograd before they reach the accumulator) free it.
#include <algorithm>
#include <cstddef>
#include <stdexcept>

#include <torch/torch.h>

#include "parallel/data/zero_state.h"

namespace meshsim {
namespace {

class ZeroBlockImpl : public ZeroWrapper {
public:
  /// `before_forward` and `before_backward`: gather this block's units (waiting for their
  /// gathers) and start the next block's, in forward and in backward order; `release`: frees
  /// this block's units.
  ZeroBlockImpl(torch::nn::AnyModule inner, std::function<void()> before_forward,
                std::function<void()> before_backward, std::function<void()> release,
                bool reshard_after_forward)
      : ZeroWrapper(std::move(inner)), before_forward_(std::move(before_forward)),
        before_backward_(std::move(before_backward)), release_(std::move(release)),
        reshard_(reshard_after_forward) {}

  torch::Tensor forward(torch::Tensor x) {
    before_forward_();
    torch::Tensor y = inner_.forward(x);
    // Without autograd (evaluation) no backward will free them: always free here.
    if (reshard_ || !y.requires_grad())
      release_();
    // Runs when the gradient of y is ready, i.e. before any backward node of this block.
    if (y.requires_grad())
      y.register_hook([before = before_backward_](const torch::Tensor&) { before(); });
    return y;
  }

private:
  std::function<void()> before_forward_;
  std::function<void()> before_backward_;
  std::function<void()> release_;
  bool reshard_;
};
TORCH_MODULE(ZeroBlock);

} // namespace

void ZeroDataParallel::State::gather(FlatUnit& unit) {
  prefetch(unit);
  const auto it = param_gathers.find(&unit);
  if (it == param_gathers.end()) // gathered already
    return;
  const std::unique_ptr<Work> work = std::move(it->second);
  param_gathers.erase(it);
  work->wait();
  ctx.sample_memory(step, "all_gather");
}

void ZeroDataParallel::State::prefetch(FlatUnit& unit) {
  if (unit.materialized)
    return;
  torch::NoGradGuard no_grad;
  allocate_full(unit);
  torch::Tensor into = unit.full.view({unit.group.size(), -1});
  param_gathers.emplace(&unit, ctx.comm.all_gather_async(unit.shard, into, unit.group));
}

void ZeroDataParallel::State::release(FlatUnit& unit) {
  if (param_gathers.count(&unit))
    gather(unit); // the communication thread may still be writing into `full`
  release_full(unit);
}

torch::nn::Sequential ZeroDataParallel::State::wrap_blocks() {
  torch::nn::Sequential wrapped;
  const auto names = model->named_children();
  size_t child = 0;
  size_t block = 0; // blocks in forward order, each with a unit per parameter group
  std::vector<std::vector<FlatUnit*>> units_of(model->size()); // each child's
  for (size_t c = 0; c < model->size(); ++c)
    if (!model->ptr(c)->parameters().empty())
      units_of[c] = block_units[block++];
  for (const auto& [reader, owner] : options.shared_children) {
    if (reader >= model->size() || owner >= model->size() || units_of[owner].empty() ||
        !units_of[reader].empty())
      throw std::invalid_argument(
          "zero: a shared child must be one without parameters reading a child with some");
    units_of[reader] = units_of[owner];
  }
  // The units of the nearest child with parameters after (forward) or before (backward) `c`
  // that are not `c`'s own.
  const auto neighbour = [&units_of](size_t c, int direction) {
    std::vector<FlatUnit*> out;
    for (auto k = static_cast<std::ptrdiff_t>(c) + direction;
         out.empty() && k >= 0 && k < static_cast<std::ptrdiff_t>(units_of.size()); k += direction)
      for (FlatUnit* unit : units_of[static_cast<size_t>(k)])
        if (std::find(units_of[c].begin(), units_of[c].end(), unit) == units_of[c].end())
          out.push_back(unit);
    return out;
  };
  bool wrapped_one = false;
  for (const auto& any : *model) {
    const size_t c = child;
    const std::string& name = names[child++].key();
    if (units_of[c].empty()) {
      wrapped->push_back(name, torch::nn::AnyModule(any));
      continue;
    }
    const std::vector<FlatUnit*> mine = units_of[c], next = neighbour(c, 1),
                                 previous = neighbour(c, -1);
    // The first block's forward starts a micro-batch: the last backward's reduce-scatter still
    // in flight is waited for there, so that one micro-batch's buckets do not outlive it.
    const bool first = !wrapped_one;
    wrapped_one = true;
    ZeroBlock wrapper(
        any,
        [this, mine, next, first] {
          if (first)
            wait_in_flight();
          for (FlatUnit* unit : mine) gather(*unit);
          for (FlatUnit* unit : next) prefetch(*unit); // runs beside this block's forward
        },
        [this, mine, previous] {
          for (FlatUnit* unit : mine) gather(*unit);
          for (FlatUnit* unit : previous) prefetch(*unit); // beside this block's backward
        },
        [this, mine] {
          for (FlatUnit* unit : mine) release(*unit);
        },
        options.reshard_after_forward);
    wrapped->push_back(name, torch::nn::AnyModule(wrapper));
  }
  return wrapped;
}

} // namespace meshsim
