// Building a model by name (under one seed, on a device, in a dtype) and what every model
// shares: parameters listed once, and dropout with a generator per rank. The models themselves
// are their own files (cnn.h, gpt.h, llama.h, resnet.h), found through models/family.h.
#include "models/models.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "memory/allocator.h"
#include "models/family.h"
#include "models/layers/attention.h"
#include "models/layers/fused_core.h"

namespace meshsim {
namespace {

std::vector<RankDropoutImpl*> rank_dropouts(torch::nn::Module& model) {
  std::vector<RankDropoutImpl*> out;
  for (const auto& m : model.modules(/*include_self=*/false))
    if (auto* d = m->as<RankDropoutImpl>())
      out.push_back(d);
  return out;
}

} // namespace

RankDropoutImpl::RankDropoutImpl(double p, bool channelwise, uint64_t seed)
    : p_(p), channelwise_(channelwise), generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {
}

torch::Tensor RankDropoutImpl::forward(const torch::Tensor& x) {
  if (!is_training() || p_ == 0)
    return x;
  std::vector<int64_t> shape = x.sizes().vec();
  if (channelwise_)
    for (size_t d = 2; d < shape.size(); ++d)
      shape[d] = 1;
  torch::Tensor keep;
  {
    torch::NoGradGuard no_grad;
    // Drawn on the CPU from the rank's own generator whatever the device, so a CUDA run
    // drops exactly what the CPU run drops.
    keep = torch::empty(shape, x.options().device(torch::kCPU))
               .bernoulli_(1 - p_, generator_)
               .div_(1 - p_)
               .to(x.device());
  }
  return x * keep;
}

torch::Tensor dropout_rng_state(torch::nn::Module& model) {
  std::vector<torch::Tensor> states;
  for (auto* d : rank_dropouts(model))
    states.push_back(d->generator().get_state());
  return states.empty() ? torch::empty({0}, torch::kUInt8) : torch::cat(states);
}

void set_dropout_rng_state(torch::nn::Module& model, const torch::Tensor& state) {
  const auto dropouts = rank_dropouts(model);
  if (dropouts.empty() && state.numel() == 0)
    return;
  if (dropouts.empty() || state.numel() % static_cast<int64_t>(dropouts.size()) != 0)
    throw std::runtime_error("the dropout generator states do not fit this model");
  const int64_t each = state.numel() / static_cast<int64_t>(dropouts.size());
  for (size_t i = 0; i < dropouts.size(); ++i)
    dropouts[i]->generator().set_state(
        state.narrow(0, static_cast<int64_t>(i) * each, each).clone());
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none")
    return Recompute::None;
  if (name == "selective")
    return Recompute::Selective;
  if (name == "op")
    return Recompute::Op;
  if (name == "full")
    return Recompute::Full;
  throw std::invalid_argument("unknown --recompute '" + name +
                              "' (choose none, selective, op or full)");
}

AttentionKind parse_attention(const std::string& name) {
  if (name == "eager")
    return AttentionKind::Eager;
  if (name == "fused")
    return AttentionKind::Fused;
  throw std::invalid_argument("unknown --attention '" + name + "' (choose fused or eager)");
}

namespace {

// --init-from's weights into a freshly built model, each parameter once (a tied one under its
// first name). A missing or misshapen one is the caller's mistake: the weights were checked
// against the run's model before they came here.
void copy_initial_weights(torch::nn::Module& model,
                          const std::vector<std::pair<std::string, torch::Tensor>>& initial) {
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, const torch::Tensor*> by_name; // one lookup per parameter
  for (const auto& [name, tensor] : initial)
    by_name.emplace(name, &tensor);
  std::unordered_set<const void*> seen;
  for (auto& item : model.named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second)
      continue;
    const auto it = by_name.find(item.key());
    if (it == by_name.end() || !it->second->sizes().equals(item.value().sizes()))
      throw std::invalid_argument("the initial weights have no parameter " + item.key() +
                                  " of its shape");
    item.value().copy_(*it->second);
  }
}

} // namespace

torch::nn::Sequential build_model(const std::string& name, const ModelOptions& options) {
  // Initialization draws from LibTorch's one global generator; rank threads building their
  // models at once would interleave their draws. One model at a time keeps every replica
  // bit-identical to PyTorch's.
  static std::mutex generator_mutex;
  std::lock_guard<std::mutex> lock(generator_mutex);
  torch::manual_seed(options.seed);
  const bool meta = options.device.is_meta();
  const ModelFamily* family = find_model_family(name);
  if (meta && !(family && family->builds_on_meta))
    throw std::invalid_argument("model '" + name + "' cannot be built on the meta device (its "
                                "layers are built on the host; gpt, llama and resnet50 can be)");
  const ModelFamily& built = model_family(name); // throws for an unknown name
  // On meta the parameters are created in their final dtype (nothing is drawn); elsewhere
  // they are drawn in float32 on the CPU, as PyTorch draws them, and converted after.
  const auto tensors = meta ? torch::TensorOptions().device(options.device).dtype(options.dtype)
                            : torch::TensorOptions().dtype(torch::kFloat32);
  // A model of another dtype is drawn on the host, as PyTorch builds a model before
  // model.to(device, dtype): the GPU holds only the converted parameters, as a plan's (built
  // in their dtype on meta) are. One in float32 is its own draw, charged where it is made.
  const bool converted = !meta && options.dtype != torch::kFloat32;
  std::optional<GpuGuard> host;
  if (converted)
    host.emplace(nullptr);
  torch::nn::Sequential model = built.build(options, tensors);
  if (options.attention == AttentionKind::Fused) {
    const auto fused = std::make_shared<FusedCausalCore>();
    for (const auto& module : model->modules(/*include_self=*/false))
      if (auto* attention = dynamic_cast<AttentionImpl*>(module.get()))
        attention->set_core(fused);
  }
  if (options.eager_elementwise)
    for (const auto& module : model->modules(/*include_self=*/false))
      if (auto* counted = dynamic_cast<ElementwiseWork*>(module.get()))
        counted->set_eager_kernels(true);
  if (meta)
    return model;
  if (options.initial)
    copy_initial_weights(*model, *options.initial);
  host.reset(); // the conversion is the GPU's
  if (converted)
    model->to(options.dtype);
  if (!options.device.is_cpu())
    model->to(options.device);
  return model;
}

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second)
      out.push_back(p);
  return out;
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : unique_parameters(module))
    n += p.numel();
  return n;
}

} // namespace meshsim
