// A tied head across pipeline stages: the last stage's copy of the word embedding and the
// embedding group's sum of the two copies' gradients (tied_embedding.h).
#include "parallel/pipeline/tied_embedding.h"

#include <stdexcept>

#include "memory/allocator.h"
#include "models/device_layers.h"
#include "models/gpt.h"

namespace meshsim {

torch::Tensor tied_word_embedding(const torch::nn::Sequential& model, const std::string& head) {
  for (const auto& child : model->named_children())
    if (child.key() == head)
      if (const auto* tied = child.value()->as<TiedHeadImpl>()) return tied->weight();
  return {};
}

torch::nn::Sequential with_head_copy(const torch::nn::Sequential& model, const std::string& head,
                                     const torch::Tensor& word) {
  torch::nn::Sequential whole = model;  // shares the modules; gives non-const access
  const auto children = whole->named_children();
  torch::nn::Sequential out;
  bool found = false;
  size_t i = 0;
  for (const auto& any : *whole) {
    const std::string& name = children[i++].key();
    if (name != head) {
      out->push_back(name, any);
      continue;
    }
    torch::NoGradGuard no_grad;
    torch::nn::Linear copy = make_linear(word.size(1), word.size(0), false, word.options());
    copy->weight.copy_(word);
    out->push_back(name, torch::nn::AnyModule(copy));
    found = true;
  }
  if (!found)
    throw std::invalid_argument("tied embedding: the model has no child '" + head + "'");
  return out;
}

void all_reduce_word_embedding_grads(Communicator& comm, const TiedEmbedding& tied) {
  if (!tied.weight.defined() || tied.group.size() < 2) return;
  torch::Tensor grad = tied.weight.grad();
  if (!grad.defined())
    throw std::logic_error("tied embedding: the word embedding has no gradient to sum");
  CategoryScope scope(MemoryCategory::Communication);
  torch::NoGradGuard no_grad;
  if (tied.tp.size() < 2) {
    comm.all_reduce(grad, ReduceOp::Sum, tied.group);
    return;
  }
  // The first stage's whole embedding against the last stage's shard t: sum rows t, then
  // gather every tp rank's summed rows back into the whole gradient.
  torch::Tensor rows = grad.narrow(0, tied.tp_index * tied.rows, tied.rows).clone();
  comm.all_reduce(rows, ReduceOp::Sum, tied.group);
  grad.copy_(comm.all_gather(rows, tied.tp).view_as(grad));
}

} // namespace meshsim
