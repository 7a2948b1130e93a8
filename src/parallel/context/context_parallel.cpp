// Context parallelism's layout of the sequence, the all-gather core, and the installation of
// a core in every attention module. The ring core is in ring_attention.cpp.
#include "parallel/context/context_parallel.h"

#include <stdexcept>

#include <fmt/format.h>

#include "models/layers/fused_core.h"
#include "models/layers/rotary.h"
#include "parallel/autograd_group.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y [B, kv_heads, T, d] -> [B, kv_heads · group, T, d], kv head j serving query heads
// j·group .. (j+1)·group - 1 (as attention.cpp repeats them).
torch::Tensor repeat_kv_heads(const torch::Tensor& y, int64_t group) {
  if (group == 1)
    return y;
  const int64_t b = y.size(0), n = y.size(1), t = y.size(2), d = y.size(3);
  return y.unsqueeze(2).expand({b, n, group, t, d}).reshape({b, n * group, t, d});
}

// The members' K/V blocks [2, B, kv_heads, T/C, d] -> [2, B, kv_heads, T, d], member j's at
// [j·T/C, (j+1)·T/C); backward reduce-scatters (sums) the gradient back to the blocks.
struct GatherKvBlocks : public torch::autograd::Function<GatherKvBlocks> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor kv, Communicator* comm,
                               const Group* group) {
    save_group(ctx, comm, *group);
    const torch::Tensor all = comm->all_gather(kv.contiguous(), *group); // [C, *kv]
    return torch::cat(all.unbind(0), 3);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Group group = saved_group(ctx);
    const torch::Tensor& g = grads[0];
    std::vector<int64_t> block(g.sizes().begin(), g.sizes().end());
    block[3] /= group.size();
    const torch::Tensor parts = torch::stack(g.chunk(group.size(), 3)).contiguous();
    torch::Tensor mine = saved_comm(ctx).reduce_scatter(parts, ReduceOp::Sum, group).view(block);
    return {mine, torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

const std::vector<std::string>& cp_comm_names() {
  static const std::vector<std::string> names{"allgather", "ring"};
  return names;
}

torch::Tensor cp_positions(int64_t seq_len, int cp, int index, const torch::TensorOptions& options) {
  if (cp < 1 || seq_len % (2 * cp) != 0 || index < 0 || index >= cp)
    throw std::invalid_argument(fmt::format(
        "context parallel: a sequence of {} does not split into 2 × {} chunks", seq_len, cp));
  const int64_t chunk = seq_len / (2 * cp);
  const auto o = options.dtype(torch::kLong);
  return torch::cat({arange_allocated(index * chunk, (index + 1) * chunk, 1, o),
                     arange_allocated((2 * cp - 1 - index) * chunk, (2 * cp - index) * chunk, 1, o)});
}

torch::Tensor cp_shard_sequence(const torch::Tensor& x, int cp, int index) {
  if (cp == 1)
    return x;
  const int64_t t = x.size(1), chunk = t / (2 * cp);
  if (t % (2 * cp) != 0)
    throw std::invalid_argument(fmt::format(
        "context parallel: a sequence of {} does not split into 2 × {} chunks", t, cp));
  return torch::cat({x.narrow(1, index * chunk, chunk),
                     x.narrow(1, (2 * cp - 1 - index) * chunk, chunk)},
                    1);
}

BlockAttention block_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& q_positions,
                               const torch::Tensor& k_positions, bool fused,
                               const AttentionDropout& dropout) {
  const int64_t group = q.size(1) / k.size(1);
  const torch::Tensor keys = repeat_kv_heads(k, group), values = repeat_kv_heads(v, group);
  if (!fused)
    return partial_attention_reference(q, keys, values, q_positions, k_positions, 0, dropout);
  PartialAttention part = fused_attention(q, keys, values, q_positions, k_positions, 0, dropout);
  return {std::move(part.out), std::move(part.lse)};
}

ContextParallelCore::ContextParallelCore(Communicator& comm, Group group, bool fused)
    : comm_(comm), group_(std::move(group)), index_(group_.index_of(comm.rank())), fused_(fused) {
  if (index_ < 0)
    throw std::invalid_argument("context parallel: the rank is not in its cp group");
}

torch::Tensor AllGatherAttentionCore::forward_with_dropout(const torch::Tensor& q,
                                                           const torch::Tensor& k,
                                                           const torch::Tensor& v,
                                                           const torch::Tensor& positions,
                                                           const AttentionDropout& dropout) const {
  const int cp = group().size();
  const torch::Tensor kv = GatherKvBlocks::apply(torch::stack({k, v}), &comm(), &group());
  std::vector<torch::Tensor> key_positions;
  for (int j = 0; j < cp; ++j)
    key_positions.push_back(cp_positions(q.size(2) * cp, cp, j, positions.options()));
  return block(q, kv[0], kv[1], positions, torch::cat(key_positions), dropout).out;
}

void parallelize_context(torch::nn::Sequential& model, const ParallelPlan& plan,
                         Communicator& comm, const Group& group, const std::string& cp_comm,
                         bool fused) {
  std::shared_ptr<const AttentionCore> core;
  if (cp_comm == "ring")
    core = std::make_shared<RingAttentionCore>(comm, group, fused);
  else if (cp_comm == "allgather")
    core = std::make_shared<AllGatherAttentionCore>(comm, group, fused);
  else
    throw std::invalid_argument("unknown --cp-comm '" + cp_comm + "' (choose allgather or ring)");
  const auto modules = model->named_modules();
  int installed = 0;
  for (const std::string& name : plan.attention) {
    const auto* module = modules.find(name);
    if (!module)
      continue;
    auto* attention = (*module)->as<AttentionImpl>();
    if (!attention)
      throw std::invalid_argument("context parallel: " + name + " is not an attention module");
    attention->set_core(core);
    ++installed;
  }
  if (installed == 0)
    throw std::invalid_argument("context parallel: the model has no attention module to give "
                                "its core to");
}

} // namespace meshsim
