// ZeRO stage 3 / FSDP: each block with parameters is wrapped so that its flat units (one per
// parameter group it has parameters in) are all-gathered just before its forward and freed
// right after; a hook on the gradient of the block's output gathers them again just before
// the block's backward runs, and the gradient hooks (zero.cpp) reduce-scatter a unit's
// gradients and free it once they have all arrived.
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
#include <stdexcept>

#include <torch/torch.h>

#include "parallel/data/zero_state.h"

namespace meshsim {
namespace {

class ZeroBlockImpl : public ZeroWrapper {
public:
  ZeroBlockImpl(torch::nn::AnyModule inner, std::function<void()> gather,
                std::function<void()> release, bool reshard_after_forward)
      : ZeroWrapper(std::move(inner)), gather_(std::move(gather)), release_(std::move(release)),
        reshard_(reshard_after_forward) {}

  torch::Tensor forward(torch::Tensor x) {
    gather_();
    torch::Tensor y = inner_.forward(x);
    // Without autograd (evaluation) no backward will free them: always free here.
    if (reshard_ || !y.requires_grad())
      release_();
    // Runs when the gradient of y is ready, i.e. before any backward node of this block.
    if (y.requires_grad())
      y.register_hook([gather = gather_](const torch::Tensor&) { gather(); });
    return y;
  }

private:
  std::function<void()> gather_;
  std::function<void()> release_;
  bool reshard_;
};
TORCH_MODULE(ZeroBlock);

} // namespace

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
  for (const auto& any : *model) {
    const size_t c = child;
    const std::string& name = names[child++].key();
    if (units_of[c].empty()) {
      wrapped->push_back(name, torch::nn::AnyModule(any));
      continue;
    }
    const std::vector<FlatUnit*> mine = units_of[c];
    ZeroBlock wrapper(
        any,
        [this, mine] {
          for (FlatUnit* unit : mine) gather(*unit);
        },
        [mine] {
          for (FlatUnit* unit : mine) release_full(*unit);
        },
        options.reshard_after_forward);
    wrapped->push_back(name, torch::nn::AnyModule(wrapper));
  }
  return wrapped;
}

} // namespace meshsim
