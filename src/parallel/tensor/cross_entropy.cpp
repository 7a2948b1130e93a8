// The vocab-parallel cross-entropy and the count of its kernels.
#include "parallel/tensor/cross_entropy.h"

#include "optim/optimizer.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// On [N, V/n] logits of this member and [N] targets (whole-vocabulary ids): the per-token loss
// is reduced to its mean here, so that the [N, V/n] gradient is formed once, in place.
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor logits, torch::Tensor targets,
                               Communicator* comm, const Group* group, int64_t index) {
    const int64_t width = logits.size(1);
    torch::Tensor max = std::get<0>(logits.max(1));
    comm->all_reduce(max, ReduceOp::Max, *group);
    torch::Tensor softmax = logits - max.unsqueeze(1);
    // The target's column in this slice; rows whose target another member holds pick 0.
    // (Products with the mask, not masked_fill or logical_or: the meta device runs these.)
    torch::Tensor column = targets - index * width;
    const torch::Tensor here = column.ge(0).bitwise_and(column.lt(width));
    column.mul_(here.to(column.scalar_type()));
    torch::Tensor picked = softmax.gather(1, column.unsqueeze(1)).squeeze(1);
    picked.mul_(here.to(picked.scalar_type()));
    comm->all_reduce(picked, ReduceOp::Sum, *group);
    softmax.exp_();
    torch::Tensor sum = softmax.sum(1);
    comm->all_reduce(sum, ReduceOp::Sum, *group);
    // The mean as a sum over a count of its own dtype: mean() on the CPU divides by a wrapped
    // integer, cast into a temporary the meta device never makes, at this stage's peak.
    const torch::Tensor count = torch::full({}, static_cast<double>(logits.size(0)), sum.options());
    const torch::Tensor loss = (sum.log() - picked).sum().div_(count);
    softmax.div_(sum.unsqueeze(1));
    ctx->save_for_backward({softmax, column, here});
    ctx->saved_data["count"] = static_cast<double>(logits.size(0));
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0]; // the softmax, used once: it becomes the gradient in place
    const torch::Tensor& column = saved[1];
    const torch::Tensor one_hot = saved[2].to(grad.scalar_type()).neg_(); // −1 where here
    grad.scatter_add_(1, column.unsqueeze(1), one_hot.unsqueeze(1));
    grad.mul_(grads[0] / ctx->saved_data["count"].toDouble());
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_in,
                                           const torch::Tensor& targets, Communicator& comm,
                                           const Group& group, int index) {
  const torch::Tensor logits =
      is_low_precision(logits_in.scalar_type()) ? logits_in.to(torch::kFloat32) : logits_in;
  const int64_t width = logits.size(-1);
  return VocabParallelCrossEntropy::apply(logits.reshape({-1, width}), targets.reshape({-1}),
                                          &comm, &group, static_cast<int64_t>(index));
}

LossWork vocab_parallel_cross_entropy_work(double tokens, double width, double elem_bytes) {
  const double n = tokens * width; // the slice's elements, fp32 after the cast
  // The kernels over the tokens alone (forward: the target's column, its two bounds and their
  // and, the column and the picked logit times that mask, the gather, log, the loss and its
  // mean; backward: the mask's cast and sign, its scatter): an 8-byte value read and one
  // written a token each.
  auto per_token = [tokens](LayerWork& w, int kernels) {
    for (int k = 0; k < kernels; ++k) add_kernel(w, tokens, 16 * tokens);
  };
  LossWork work;
  LayerWork& f = work.forward;
  f.layer = "loss";
  f.op = "elementwise";
  if (elem_bytes != 4) add_kernel(f, 0, n * (elem_bytes + 4)); // to fp32
  add_kernel(f, n, 4 * n + 4 * tokens);                          // the rows' max
  add_elementwise(f, n, 1, 1, 1, 4);                             // − max
  add_elementwise(f, n, 4, 1, 1, 4);                             // exp, in place
  add_kernel(f, n, 4 * n + 4 * tokens);                          // the rows' sum
  add_elementwise(f, n, 1, 1, 1, 4);                             // ÷ sum: the softmax
  per_token(f, 10);
  LayerWork& b = work.backward;
  b.layer = "loss";
  b.op = "elementwise";
  per_token(b, 3);
  add_elementwise(b, n, 1, 1, 1, 4);                             // × the loss's gradient
  if (elem_bytes != 4) add_kernel(b, 0, n * (4 + elem_bytes));   // back to the logits' type
  return work;
}

} // namespace meshsim
