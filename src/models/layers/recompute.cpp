// Reentrant activation checkpointing and the --recompute switch over a model's blocks.
#include "models/layers/recompute.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "models/layers/dropout.h"
#include "models/layers/positions.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local KeptOutputs* kept_outputs = nullptr;

// A linear whose output the forward kept: returns it again with the linear's backward, the
// matmul not run.
// `operands` are x and the weight, and the bias when there is one (an undefined tensor is
// no input of a custom function).
struct KeptLinearFunction : public torch::autograd::Function<KeptLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::TensorList operands,
                               const torch::Tensor& kept) {
    ctx->save_for_backward({operands[0], operands[1]});
    ctx->saved_data["bias"] = operands.size() > 2;
    return kept; // an input returned: autograd hands out a view of it with this node
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const torch::Tensor& g = grads[0];
    const int64_t out = weight.size(0), in = weight.size(1);
    const torch::Tensor g2 = g.reshape({-1, out});
    variable_list result{g.matmul(weight), g2.t().mm(x.reshape({-1, in}))};
    if (ctx->saved_data["bias"].toBool())
      result.push_back(g2.sum(0));
    result.emplace_back(); // none for the kept output
    return result;
  }
};

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

void KeptOutputs::keep(std::vector<torch::Tensor> outputs) {
  kept_.push_back(std::move(outputs));
}

std::vector<torch::Tensor> KeptOutputs::take() {
  if (next_ >= kept_.size())
    throw std::logic_error("op-level recomputation: the recompute asked for kept output " +
                           std::to_string(next_ + 1) + " of a forward that kept " +
                           std::to_string(kept_.size()));
  return kept_[next_++];
}

void KeptOutputs::start_replay() {
  replaying_ = true;
  next_ = 0;
}

void KeptOutputs::clear() {
  kept_.clear();
  next_ = 0;
}

KeptOutputs* current_kept_outputs() {
  return kept_outputs;
}

KeptOutputsScope::KeptOutputsScope(KeptOutputs* kept) : previous_(kept_outputs) {
  kept_outputs = kept;
}

KeptOutputsScope::~KeptOutputsScope() {
  kept_outputs = previous_;
}

torch::Tensor kept_linear(torch::nn::AnyModule& linear, const torch::Tensor& x) {
  KeptOutputs* kept = kept_outputs;
  if (!kept)
    return linear.forward(x);
  if (!kept->replaying()) {
    torch::Tensor y = linear.forward(x);
    kept->keep({y});
    return y;
  }
  torch::Tensor weight, bias;
  for (const auto& p : linear.ptr()->named_parameters(/*recurse=*/false)) {
    if (p.key() == "weight") weight = p.value();
    if (p.key() == "bias") bias = p.value();
  }
  const torch::Tensor y = kept->take()[0];
  if (!weight.defined() || weight.dim() != 2)
    throw std::logic_error("op-level recomputation kept the output of a module without a 2-D "
                           "weight");
  std::vector<torch::Tensor> operands{x, weight};
  if (bias.defined())
    operands.push_back(bias);
  return KeptLinearFunction::apply(torch::TensorList(operands), y);
}

torch::Tensor CheckpointedBlock::checkpointed(const torch::Tensor& x) {
  if (!recompute)
    return forward_plain(x);
  // The block outlives the graph (the model owns it). The recompute runs in backward, maybe on
  // another thread (a device's autograd worker): it gets the forward's positions scope.
  const torch::Tensor positions = scoped_positions();
  // Op-level: the first run (the forward) records what it keeps, the second (the recompute)
  // replays it. Otherwise nothing is kept.
  const auto kept = keep_matmuls ? std::make_shared<KeptOutputs>() : nullptr;
  return checkpoint(
      [this, positions, kept](const std::vector<torch::Tensor>& in) {
        PositionsScope scope(positions);
        KeptOutputsScope keeping(kept.get());
        torch::Tensor out = forward_plain(in[0]);
        if (kept && kept->replaying())
          kept->clear();
        else if (kept)
          kept->start_replay();
        return out;
      },
      {x});
}

void set_recompute(torch::nn::Sequential& model, Recompute recompute) {
  for (const auto& module : model->modules(/*include_self=*/false)) {
    if (auto* block = dynamic_cast<CheckpointedBlock*>(module.get())) {
      block->recompute = recompute == Recompute::Full || recompute == Recompute::Op;
      block->keep_matmuls = recompute == Recompute::Op;
    }
    if (auto* attention = dynamic_cast<CheckpointedAttention*>(module.get()))
      attention->recompute_core =
          recompute == Recompute::Selective && attention->core_recomputable();
  }
}

} // namespace meshsim
