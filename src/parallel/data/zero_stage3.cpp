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
#include <torch/torch.h>

#include "parallel/data/zero_state.h"

namespace meshsim {
namespace {

class ZeroBlockImpl : public torch::nn::Module {
public:
  ZeroBlockImpl(torch::nn::AnyModule inner, std::function<void()> gather,
                std::function<void()> release)
      : inner_(std::move(inner)), gather_(std::move(gather)), release_(std::move(release)) {
    register_module("block", inner_.ptr());
  }

  torch::Tensor forward(torch::Tensor x) {
    gather_();
    torch::Tensor y = inner_.forward(x);
    release_();
    // Runs when the gradient of y is ready, i.e. before any backward node of this block.
    if (y.requires_grad())
      y.register_hook([gather = gather_](const torch::Tensor&) { gather(); });
    return y;
  }

private:
  torch::nn::AnyModule inner_;
  std::function<void()> gather_;
  std::function<void()> release_;
};
TORCH_MODULE(ZeroBlock);

} // namespace

torch::nn::Sequential ZeroDataParallel::State::wrap_blocks() {
  torch::nn::Sequential wrapped;
  const auto names = model->named_children();
  size_t child = 0;
  size_t block = 0; // blocks in forward order, each with a unit per parameter group
  for (const auto& any : *model) {
    const std::string& name = names[child++].key();
    if (any.ptr()->parameters().empty()) {
      wrapped->push_back(name, torch::nn::AnyModule(any));
      continue;
    }
    const std::vector<FlatUnit*> mine = block_units[block++];
    ZeroBlock wrapper(
        any,
        [this, mine] {
          for (FlatUnit* unit : mine) gather(*unit);
        },
        [mine] {
          for (FlatUnit* unit : mine) release_full(*unit);
        });
    wrapped->push_back(name, torch::nn::AnyModule(wrapper));
  }
  return wrapped;
}

} // namespace meshsim
