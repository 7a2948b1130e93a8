// Sequence parallelism's mappings, the column layer's input kept as this member's part of the
// sequence, and the all-reduce of the partial gradients. See sequence_parallel.h.
#include "parallel/tensor/sequence_parallel.h"

#include <stdexcept>

#include <fmt/format.h>

#include "memory/allocator.h"
#include "parallel/autograd_group.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// This member's part of x's sequence (dimension 1), as its own tensor.
torch::Tensor own_part(const torch::Tensor& x, Communicator& comm, const Group& group) {
  const int64_t n = group.size(), t = x.size(1);
  if (t % n != 0)
    throw std::invalid_argument(
        fmt::format("sequence parallel: a sequence of {} does not split over {} members", t, n));
  return x.narrow(1, group.index_of(comm.rank()) * (t / n), t / n).clone();
}

// A mapping between the sequence and tensor regions: `Forward` in forward, `Backward` (its
// adjoint) on the gradient.
using SequenceOp = torch::Tensor (*)(const torch::Tensor&, Communicator&, const Group&);

template <SequenceOp Forward, SequenceOp Backward>
struct SequenceMapping : public torch::autograd::Function<SequenceMapping<Forward, Backward>> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               const Group* group) {
    save_group(ctx, comm, *group);
    return Forward(x, *comm, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Backward(grads[0], saved_comm(ctx), saved_group(ctx)), torch::Tensor(),
            torch::Tensor()};
  }
};

template <SequenceOp Forward, SequenceOp Backward>
torch::Tensor map_sequence(const torch::Tensor& x, Communicator& comm, const Group& group) {
  if (group.size() == 1)
    return x;
  return SequenceMapping<Forward, Backward>::apply(x, &comm, &group);
}

// Megatron's LinearWithGradAccumulationAndAsyncCommunication with sequence parallelism: the
// forward reads the gathered input, the backward keeps only the member's part and gathers the
// whole again for the weight's gradient. The gradient of the gathered input is returned as
// it is: the gather's own backward reduce-scatters it (once for every layer sharing it).
struct GatheredLinear : public torch::autograd::Function<GatheredLinear> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor full, torch::Tensor chunk,
                               torch::Tensor weight, c10::optional<torch::Tensor> bias,
                               SequenceRegather* regather) {
    ctx->save_for_backward({chunk, weight});
    ctx->saved_data["regather"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(regather));
    ctx->saved_data["bias"] = bias.has_value();
    return torch::nn::functional::linear(full, weight, bias.value_or(torch::Tensor()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* regather = reinterpret_cast<SequenceRegather*>(
        static_cast<intptr_t>(ctx->saved_data["regather"].toInt()));
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& weight = saved[1];
    const torch::Tensor g = grads[0];
    const torch::Tensor rows = g.reshape({-1, g.size(-1)});
    torch::Tensor grad_full = g.matmul(weight);
    torch::Tensor full = regather->get(saved[0]);
    torch::Tensor grad_weight = rows.t().mm(full.reshape({-1, full.size(-1)}));
    full = torch::Tensor();
    torch::Tensor grad_bias = ctx->saved_data["bias"].toBool() ? rows.sum(0) : torch::Tensor();
    return {grad_full, torch::Tensor(), grad_weight, grad_bias, torch::Tensor()};
  }
};

} // namespace

torch::Tensor all_gather_sequence(const torch::Tensor& x, Communicator& comm, const Group& group) {
  if (group.size() == 1)
    return x;
  torch::Tensor all = comm.all_gather(x.contiguous(), group); // [n, B, T/n, ...]
  return torch::cat(all.unbind(0), 1);
}

torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, Communicator& comm,
                                      const Group& group) {
  const int64_t n = group.size(), t = x.size(1);
  if (n == 1)
    return x;
  if (t % n != 0)
    throw std::invalid_argument(
        fmt::format("sequence parallel: a sequence of {} does not split over {} members", t, n));
  // Member i's part first: [B, T, ...] as [n, B, T/n, ...], contiguous.
  std::vector<int64_t> split{x.size(0), n, t / n};
  for (int64_t d = 2; d < x.dim(); ++d)
    split.push_back(x.size(d));
  const torch::Tensor parts = x.reshape(split).transpose(0, 1).contiguous();
  std::vector<int64_t> part(x.sizes().begin(), x.sizes().end());
  part[1] = t / n;
  return comm.reduce_scatter(parts, ReduceOp::Sum, group).view(part);
}

torch::Tensor scatter_to_sequence_region(const torch::Tensor& x, Communicator& comm,
                                         const Group& group) {
  return map_sequence<own_part, all_gather_sequence>(x, comm, group);
}

torch::Tensor gather_from_sequence_region(const torch::Tensor& x, Communicator& comm,
                                          const Group& group) {
  return map_sequence<all_gather_sequence, own_part>(x, comm, group);
}

torch::Tensor gather_to_tensor_region(const torch::Tensor& x, Communicator& comm,
                                      const Group& group) {
  return map_sequence<all_gather_sequence, reduce_scatter_sequence>(x, comm, group);
}

torch::Tensor reduce_scatter_to_sequence_region(const torch::Tensor& x, Communicator& comm,
                                                const Group& group) {
  return map_sequence<reduce_scatter_sequence, all_gather_sequence>(x, comm, group);
}

SequenceRegather::SequenceRegather(Communicator& comm, Group group, int consumers)
    : comm_(comm), group_(std::move(group)), consumers_(consumers) {}

torch::Tensor SequenceRegather::get(const torch::Tensor& chunk) {
  // The same part of the sequence: same storage, offset and shape. (A saved tensor comes
  // back from autograd as another TensorImpl over the same storage.)
  const bool same =
      uses_left_ > 0 &&
      chunk.storage().unsafeGetStorageImpl() == chunk_.storage().unsafeGetStorageImpl() &&
      chunk.storage_offset() == chunk_.storage_offset() && chunk.sizes() == chunk_.sizes();
  if (same) {
    torch::Tensor out = full_;
    if (--uses_left_ == 0)
      chunk_ = full_ = torch::Tensor();
    return out;
  }
  torch::NoGradGuard no_grad;
  torch::Tensor out = all_gather_sequence(chunk, comm_, group_);
  uses_left_ = consumers_ - 1;
  chunk_ = uses_left_ > 0 ? chunk : torch::Tensor();
  full_ = uses_left_ > 0 ? out : torch::Tensor();
  return out;
}

torch::Tensor gathered_linear(const torch::Tensor& full, const torch::Tensor& chunk,
                              const torch::Tensor& weight, const torch::Tensor& bias,
                              SequenceRegather& regather) {
  // An undefined tensor cannot be an autograd input; an absent optional is no input at all.
  const c10::optional<torch::Tensor> b =
      bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt;
  return GatheredLinear::apply(full, chunk, weight, b, &regather);
}

void all_reduce_sequence_parallel_gradients(const std::vector<torch::Tensor>& params,
                                            Communicator& comm, const Group& group) {
  if (group.size() == 1 || params.empty())
    return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined())
      throw std::invalid_argument("sequence parallel: a parameter has no gradient to all-reduce");
    grads.push_back(p.grad().reshape({-1}));
  }
  torch::Tensor flat;
  {
    CategoryScope scope(MemoryCategory::Communication);
    flat = torch::cat(grads);
  }
  grads.clear();
  comm.all_reduce(flat, ReduceOp::Sum, group);
  int64_t offset = 0;
  for (const auto& p : params) {
    torch::Tensor g = p.grad();
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

} // namespace meshsim
