// Reentrant activation checkpointing and the --recompute switch over a model's blocks.
#include "models/layers/recompute.h"

#include <algorithm>

#include "models/layers/dropout.h"
#include "models/layers/positions.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True):
// forward runs the function without recording a graph and keeps only its inputs; backward
// runs it again with grad enabled and backpropagates through that fresh graph, which
// accumulates into the .grad of the parameters it uses and yields the inputs' gradients.
// Collectives inside it (tensor-parallel layers of a block) run again in the recompute, in
// the same order on every member, because every member recomputes the same functions in the
// same order.
struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  // saved_data holds IValues: the function travels in a capsule that owns it.
  struct Held : torch::CustomClassHolder {
    explicit Held(Recomputable f) : fn(std::move(f)) {}
    Recomputable fn;
  };

  static torch::Tensor forward(AutogradContext* ctx, torch::TensorList inputs,
                               const Recomputable& fn) {
    // Function::apply has turned grad mode off here, so no activations are kept.
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<Held>(fn));
    return fn(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto held = c10::static_intrusive_pointer_cast<Held>(ctx->saved_data["fn"].toCapsule());
    std::vector<torch::Tensor> inputs;
    for (const torch::Tensor& saved : ctx->get_saved_variables())
      inputs.push_back(saved.detach().requires_grad_(saved.requires_grad()));
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true); // the engine runs backward with grad mode off
      out = held->fn(inputs);
    }
    torch::autograd::backward({out}, {grad_outputs[0]});
    variable_list grads;
    for (const torch::Tensor& input : inputs)
      grads.push_back(input.grad());
    grads.emplace_back(); // no gradient for the function
    return grads;
  }
};

} // namespace

torch::Tensor checkpoint(const Recomputable& fn, const std::vector<torch::Tensor>& inputs) {
  // Checkpointing only pays when a graph is being recorded. Inputs that need no gradient
  // would leave the checkpoint node without edges, so the parameters would get none: run
  // such a function plainly (torch.utils.checkpoint warns in that case instead).
  const bool any_grad = std::any_of(inputs.begin(), inputs.end(),
                                    [](const torch::Tensor& t) { return t.requires_grad(); });
  if (torch::GradMode::is_enabled() && any_grad) {
    // The recompute runs in backward, when another micro-batch's draw may be installed: it
    // reinstalls this forward's, so its dropout masks are the ones this forward drew.
    const std::shared_ptr<const DropoutDraw> draw = current_dropout_draw();
    if (!draw)
      return Checkpoint::apply(torch::TensorList(inputs), fn);
    return Checkpoint::apply(torch::TensorList(inputs),
                             Recomputable([fn, draw](const std::vector<torch::Tensor>& in) {
                               DropoutScope scope(draw);
                               return fn(in);
                             }));
  }
  return fn(inputs);
}

torch::Tensor CheckpointedBlock::checkpointed(const torch::Tensor& x) {
  if (!recompute)
    return forward_plain(x);
  // The block outlives the graph (the model owns it). The recompute runs in backward, maybe on
  // another thread (a device's autograd worker): it gets the forward's positions scope.
  const torch::Tensor positions = scoped_positions();
  return checkpoint(
      [this, positions](const std::vector<torch::Tensor>& in) {
        PositionsScope scope(positions);
        return forward_plain(in[0]);
      },
      {x});
}

void set_recompute(torch::nn::Sequential& model, Recompute recompute) {
  for (const auto& module : model->modules(/*include_self=*/false)) {
    if (auto* block = dynamic_cast<CheckpointedBlock*>(module.get()))
      block->recompute = recompute == Recompute::Full;
    if (auto* attention = dynamic_cast<CheckpointedAttention*>(module.get())) {
      attention->recompute_core =
          recompute == Recompute::Selective && attention->core_recomputable();
      attention->recompute_projections = recompute == Recompute::Op;
    }
    if (auto* feed_forward = dynamic_cast<CheckpointedFeedForward*>(module.get()))
      feed_forward->recompute_first = recompute == Recompute::Op;
  }
}

} // namespace meshsim
