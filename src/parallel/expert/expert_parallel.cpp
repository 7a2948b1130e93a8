// Expert parallelism: the token exchange of every MoE layer (expert_parallel.h).
#include "parallel/expert/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "memory/allocator.h"
#include "models/layers/moe.h"
#include "parallel/autograd_group.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// all_to_all of rows, differentiable: backward sends each row's gradient back to the rank it
// came from (the same exchange with the splits swapped).
struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows,
                               std::vector<int64_t> send, std::vector<int64_t> receive,
                               Communicator* comm, const Group& group) {
    save_group(ctx, comm, group);
    ctx->saved_data["send"] = send;
    ctx->saved_data["receive"] = receive;
    CategoryScope scope(MemoryCategory::Communication);
    return comm->all_to_all(rows.contiguous(), receive, send, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    CategoryScope scope(MemoryCategory::Communication);
    torch::Tensor back =
        saved_comm(ctx).all_to_all(grads[0].contiguous(), send, receive, saved_group(ctx));
    return {back, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// What a rank sends in one layer's dispatch: to each destination, each token with at least one
// assignment there, once, in token order; with each such row, k slots naming the destination's
// local expert of one of those assignments (-1: none) and holding its weight.
struct Outbound {
  std::vector<int64_t> send;     // [members]: rows to each destination
  std::vector<int64_t> token;    // [rows]: the token of each row
  std::vector<int64_t> slot_of;  // [assignments]: row · k + slot of each assignment
  std::vector<int64_t> expert;   // [rows · k]: the local expert of each slot, -1 none
};

Outbound outbound(const torch::Tensor& token_of, const torch::Tensor& counts, int64_t tokens,
                  int ranks, int64_t local, int64_t k) {
  const auto* token = token_of.data_ptr<int64_t>();
  const auto* count = counts.data_ptr<int64_t>();
  Outbound o;
  o.send.assign(static_cast<size_t>(ranks), 0);
  o.slot_of.resize(static_cast<size_t>(token_of.numel()));
  std::vector<int64_t> row_of(static_cast<size_t>(tokens), -1); // at the current destination
  int64_t begin = 0;
  for (int r = 0; r < ranks; ++r) {
    int64_t end = begin;
    for (int64_t e = 0; e < local; ++e)
      end += count[r * local + e];
    std::vector<int64_t> reached(token + begin, token + end);
    std::sort(reached.begin(), reached.end());
    reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
    const auto first_row = static_cast<int64_t>(o.token.size());
    for (size_t j = 0; j < reached.size(); ++j)
      row_of[static_cast<size_t>(reached[j])] = first_row + static_cast<int64_t>(j);
    o.token.insert(o.token.end(), reached.begin(), reached.end());
    o.expert.resize(o.token.size() * static_cast<size_t>(k), -1);
    for (int64_t e = 0, i = begin; e < local; ++e)
      for (int64_t n = 0; n < count[r * local + e]; ++n, ++i) {
        const int64_t row = row_of[static_cast<size_t>(token[i])];
        int64_t slot = row * k;
        while (slot < (row + 1) * k && o.expert[static_cast<size_t>(slot)] >= 0)
          ++slot;
        if (slot == (row + 1) * k) // a token's k experts are distinct
          throw std::logic_error("expert parallelism: a token has more than k assignments");
        o.expert[static_cast<size_t>(slot)] = e;
        o.slot_of[static_cast<size_t>(i)] = slot;
      }
    o.send[static_cast<size_t>(r)] = static_cast<int64_t>(reached.size());
    begin = end;
  }
  return o;
}

// The arrived rows' assignments, grouped by local expert, then by arrival: the row and the
// slot of each, and how many each expert has.
struct Inbound {
  std::vector<int64_t> row, slot;
  torch::Tensor load; // int64 [local], on the host
};

Inbound inbound(const torch::Tensor& experts, int64_t local) {
  const auto* expert = experts.data_ptr<int64_t>();
  const int64_t k = experts.size(1);
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(local));
  for (int64_t slot = 0; slot < experts.numel(); ++slot)
    if (expert[slot] >= 0)
      slots[static_cast<size_t>(expert[slot])].push_back(slot);
  Inbound in;
  in.load = torch::zeros({local}, torch::kLong);
  for (int64_t e = 0; e < local; ++e) {
    for (int64_t slot : slots[static_cast<size_t>(e)]) {
      in.row.push_back(slot / k);
      in.slot.push_back(slot);
    }
    in.load.data_ptr<int64_t>()[e] = static_cast<int64_t>(slots[static_cast<size_t>(e)].size());
  }
  return in;
}

// Host indices, as the kernels read them (arguments, not GPU memory), on `device`.
torch::Tensor indices(const std::vector<int64_t>& values, const torch::Device& device) {
  GpuGuard host(nullptr);
  return torch::tensor(values, torch::kLong).to(device);
}

// What runs the rows that arrive at one level of the exchange: the local experts, or the next
// level. Returns each row's weighted sum of its experts' outputs.
using ArrivedRows = std::function<torch::Tensor(const torch::Tensor& rows, const MoeAssignments&)>;

// DeepEP's normal dispatch and combine, as Megatron's flex dispatcher and NeMo AutoModel run
// them: each token goes once to every rank holding any of its experts, with its weights for
// them, and comes back as one row, the weighted sum of those experts' outputs. Across nodes,
// in two levels: once to each node holding any of them, to the rank at this rank's place
// there (its "rail"), then once to each rank of that node holding any of them.
class ExpertParallelDispatch final : public ExpertDispatch {
public:
  ExpertParallelDispatch(Communicator& comm, Group ep, int node_size)
      : comm_(comm), node_(std::move(ep)), rail_{{comm.rank()}} {
    // The members on each node, in group order: two levels when each node holds an unbroken
    // run of the same number of them, more than one, and there is more than one node.
    if (node_size < 1)
      return;
    std::vector<std::vector<int>> runs;
    for (int rank : node_.ranks) {
      if (runs.empty() || runs.back().front() / node_size != rank / node_size)
        runs.emplace_back();
      runs.back().push_back(rank);
    }
    const size_t per_node = runs.front().size();
    std::vector<int> nodes;
    for (const auto& run : runs) {
      if (run.size() != per_node)
        return;
      nodes.push_back(run.front() / node_size);
    }
    std::sort(nodes.begin(), nodes.end());
    if (runs.size() < 2 || per_node < 2 || std::unique(nodes.begin(), nodes.end()) != nodes.end())
      return;
    const auto place = static_cast<size_t>(node_.index_of(comm.rank())) % per_node;
    rail_.ranks.clear();
    for (const auto& run : runs) {
      rail_.ranks.push_back(run[place]);
      if (run[place] == comm.rank())
        node_.ranks = run;
    }
  }

  torch::Tensor run(MoeImpl& layer, const torch::Tensor& tokens,
                    const MoeAssignments& a) override {
    const ArrivedRows experts = [&layer](const torch::Tensor& rows, const MoeAssignments& arrived) {
      return layer.run_assignments(rows, arrived);
    };
    const int64_t local = layer.local_experts();
    if (rail_.size() == 1) // one node: once a rank
      return exchange(layer, node_, local, 0, tokens, a, experts);
    // Once a node, then once a rank within it.
    const int64_t per_node = local * node_.size();
    const int64_t node_first = rail_.index_of(comm_.rank()) * per_node;
    return exchange(layer, rail_, per_node, 0, tokens, a,
                    [&](const torch::Tensor& rows, const MoeAssignments& arrived) {
                      return exchange(layer, node_, local, node_first, rows, arrived, experts);
                    });
  }

private:
  // One level: each member of `group` holds `span` experts, member m those from first +
  // m·span on (first: where the experts `tokens` were sent for begin; the counts of
  // assignments `a` number from there). Sends `tokens` where `a` says, runs `next` on what
  // arrives, and returns each token's sum of what came back.
  torch::Tensor exchange(const MoeImpl& layer, const Group& group, int64_t span, int64_t first,
                         const torch::Tensor& tokens, const MoeAssignments& a,
                         const ArrivedRows& next) {
    const int members = group.size(), me = group.index_of(comm_.rank());
    const int64_t k = layer.options().top_k, hidden = tokens.size(1);
    const torch::Device device = tokens.device();
    const bool planned = tokens.is_meta();
    // 1. What goes where. A plan has no values to route: it sends each member the rows the
    // planned routing reaches it with, of the rows here (all of which reach this level's
    // experts), and, every rank routing the same, gets as many from each.
    const MoeOptions& o = layer.options();
    const double level_reach = planned ? planned_reach(o, first, members * span) : 1;
    const auto planned_rows = [&](int member) {
      return std::llround(static_cast<double>(tokens.size(0)) *
                          planned_reach(o, first + member * span, span) / level_reach);
    };
    Outbound out;
    if (planned) {
      for (int m = 0; m < members; ++m)
        out.send.push_back(planned_rows(m));
      const int64_t rows = std::accumulate(out.send.begin(), out.send.end(), int64_t{0});
      out.token.assign(static_cast<size_t>(rows), 0);
      out.slot_of.assign(static_cast<size_t>(a.token_of.numel()), 0);
      out.expert.assign(static_cast<size_t>(rows * k), -1);
    } else {
      out = outbound(a.token_of.cpu(), a.counts, tokens.size(0), members, span, k);
    }
    std::vector<int64_t> receive;
    {
      CategoryScope scope(MemoryCategory::Communication);
      const torch::Tensor got = comm_.all_to_all(indices(out.send, device), {}, {}, group);
      if (planned) {
        receive.assign(static_cast<size_t>(members), planned_rows(me));
      } else {
        const torch::Tensor host = got.cpu();
        receive.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + members);
      }
    }
    // 2. Dispatch: the rows with their weights in k columns beside them, and which of the
    // member's experts each slot is for.
    const torch::Tensor token_rows = indices(out.token, device);
    const torch::Tensor slot_weights =
        torch::zeros({static_cast<int64_t>(out.token.size()) * k}, a.weights.options())
            .index_add(0, indices(out.slot_of, device), a.weights)
            .view({-1, k});
    const torch::Tensor arrived = AllToAllRows::apply(
        torch::cat({tokens.index_select(0, token_rows), slot_weights}, 1), out.send, receive,
        &comm_, group);
    torch::Tensor experts;
    {
      CategoryScope scope(MemoryCategory::Communication);
      experts = comm_.all_to_all(indices(out.expert, device).view({-1, k}), receive, out.send, group);
    }
    Inbound in;
    if (planned) {
      GpuGuard host(nullptr);
      in.load = a.counts.narrow(0, me * span, span) * members;
      const auto n = static_cast<size_t>(in.load.sum().item<int64_t>());
      in.row.assign(n, 0);
      in.slot.assign(n, 0);
    } else {
      in = inbound(experts.cpu(), span);
    }
    // 3. What arrived runs on: each arrived row gets its weighted sum.
    const MoeAssignments here{
        indices(in.row, device),
        arrived.narrow(1, hidden, k).reshape({-1}).index_select(0, indices(in.slot, device)),
        in.load};
    const torch::Tensor summed = next(arrived.narrow(1, 0, hidden), here);
    // 4. Combine: back to the sources, one row a token and member, added at the tokens.
    const torch::Tensor back = AllToAllRows::apply(summed, receive, out.send, &comm_, group);
    return torch::zeros_like(tokens).index_add(0, token_rows, back);
  }

  Communicator& comm_;
  Group node_;  // the ep members on this rank's node (all of ep with one level)
  Group rail_;  // the ep members at this rank's place on every node (this rank with one level)
};

// Megatron's alltoall token dispatcher (--moe-dispatch alltoall, its default): one row an
// assignment, a token copied once for each of its experts to the member holding it, in one
// level (NCCL's all_to_all spans the nodes). The destination runs its experts on what arrived
// from every member and sends each output back; the source weights and sums them.
class AllToAllDispatch final : public ExpertDispatch {
public:
  AllToAllDispatch(Communicator& comm, Group ep) : comm_(comm), ep_(std::move(ep)) {}

  torch::Tensor run(MoeImpl& layer, const torch::Tensor& tokens,
                    const MoeAssignments& a) override {
    const int members = ep_.size(), me = ep_.index_of(comm_.rank());
    const int64_t local = layer.local_experts();
    const torch::Device device = tokens.device();
    const bool planned = tokens.is_meta();
    // 1. Counts: every member tells every other how many rows it sends each of its experts.
    // A plan, every rank routing the same, gets its experts' planned counts from each.
    const auto* to = a.counts.data_ptr<int64_t>();
    torch::Tensor got; // int64 [members · local], on the host: source-major
    {
      CategoryScope scope(MemoryCategory::Communication);
      const torch::Tensor sent = comm_.all_to_all(
          indices(std::vector<int64_t>(to, to + a.counts.numel()), device), {}, {}, ep_);
      GpuGuard host(nullptr);
      got = planned ? a.counts.narrow(0, me * local, local).repeat({members}) : sent.cpu();
    }
    const auto* from = got.data_ptr<int64_t>();
    std::vector<int64_t> send(static_cast<size_t>(members), 0), receive = send;
    for (int m = 0; m < members; ++m)
      for (int64_t e = 0; e < local; ++e) {
        send[static_cast<size_t>(m)] += to[m * local + e];
        receive[static_cast<size_t>(m)] += from[m * local + e];
      }
    // 2. Dispatch: the rows, in expert order, so grouped by destination.
    const torch::Tensor arrived = AllToAllRows::apply(tokens.index_select(0, a.token_of), send,
                                                      receive, &comm_, ep_);
    // 3. The local experts on what arrived (by source, then expert), regrouped by expert; each
    // output back in its arrival place, unweighted (the source weights them). A plan's rows
    // have only their shapes.
    std::vector<int64_t> begin(static_cast<size_t>(members * local) + 1, 0);
    std::partial_sum(from, from + members * local, begin.begin() + 1);
    std::vector<int64_t> order, load(static_cast<size_t>(local), 0);
    for (int64_t e = 0; e < local; ++e)
      for (int m = 0; m < members; ++m) {
        const auto slice = static_cast<size_t>(m * local + e);
        load[static_cast<size_t>(e)] += from[slice];
        for (int64_t r = begin[slice]; r < begin[slice + 1]; ++r)
          order.push_back(planned ? 0 : r);
      }
    torch::Tensor counts;
    {
      GpuGuard host(nullptr);
      counts = torch::tensor(load, torch::kLong);
    }
    const torch::Tensor outputs =
        layer.run_assignments(arrived, {indices(order, device), torch::Tensor(), counts});
    // 4. Back to the sources, one row an assignment, weighted and added at their tokens.
    const torch::Tensor back = AllToAllRows::apply(outputs, receive, send, &comm_, ep_);
    sent_rows_ = a.token_of.size(0);
    tokens_ = tokens.size(0);
    hidden_ = tokens.size(1);
    return torch::zeros_like(tokens).index_add(0, a.token_of, back * a.weights.unsqueeze(1));
  }

  // The source's two kernels (Megatron's permute and unpermute): its tokens copied into
  // expert order, a row an assignment (step 2's index_select), and what came back weighted
  // and summed at its tokens (step 4).
  void add_source_work(LayerWork& total, double eb) const override {
    const double h = static_cast<double>(hidden_), n = static_cast<double>(sent_rows_),
                 tokens = static_cast<double>(tokens_);
    add_elementwise(total, n * h, 0, 1, 1, eb);                  // permute
    add_kernel(total, 2 * n * h, (n * h + n + tokens * h) * eb); // unpermute, weighted
  }

private:
  Communicator& comm_;
  Group ep_;
  int64_t sent_rows_ = 0, tokens_ = 0, hidden_ = 0; // the last run's assignments sent, its tokens [N, H]
};

template <typename F>
void for_each_moe(const torch::nn::Sequential& model, F&& f) {
  for (const auto& module : model->modules(/*include_self=*/false))
    if (auto* moe = module->as<MoeImpl>())
      f(*moe);
}

} // namespace

void parallelize_experts(torch::nn::Sequential& model, Communicator& comm, const Group& ep,
                         int node_size, const std::string& exchange) {
  const int index = ep.index_of(comm.rank());
  if (index < 0)
    throw std::invalid_argument("parallelize_experts: this rank is not in its ep group");
  std::shared_ptr<ExpertDispatch> dispatch;
  if (exchange == "deepep")
    dispatch = std::make_shared<ExpertParallelDispatch>(comm, ep, node_size);
  else if (exchange == "alltoall")
    dispatch = std::make_shared<AllToAllDispatch>(comm, ep);
  else
    throw std::invalid_argument("unknown --moe-dispatch '" + exchange +
                                "' (choose deepep or alltoall)");
  for_each_moe(model, [&](MoeImpl& moe) {
    const int64_t experts = moe.options().experts;
    if (experts % ep.size() != 0)
      throw std::invalid_argument(fmt::format("--moe-experts {} is not divisible by --ep {}",
                                              experts, ep.size()));
    const int64_t per_rank = experts / ep.size();
    moe.keep_experts(index * per_rank, per_rank, dispatch);
  });
}

void split_moe_sequences(torch::nn::Sequential& model, Communicator& comm, const Group& cp) {
  MoeSequenceParts parts;
  parts.parts = cp.size();
  parts.sum = [&comm, cp](torch::Tensor& counts) {
    CategoryScope scope(MemoryCategory::Communication);
    comm.all_reduce(counts, ReduceOp::Sum, cp);
  };
  for_each_moe(model, [&](MoeImpl& moe) { moe.split_sequences(parts); });
}

std::vector<size_t> expert_parameter_indices(const torch::nn::Sequential& model) {
  std::vector<const void*> experts;
  for_each_moe(model, [&](const MoeImpl& moe) {
    for (const torch::Tensor* w : {&moe.expert_gate, &moe.expert_up, &moe.expert_down})
      experts.push_back(w->unsafeGetTensorImpl());
  });
  std::vector<size_t> indices;
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    for (const void* e : experts)
      if (params[i].unsafeGetTensorImpl() == e)
        indices.push_back(i);
  return indices;
}

std::vector<torch::Tensor> gather_experts(const std::vector<torch::Tensor>& params,
                                          Communicator& comm, const Group& ep) {
  std::vector<torch::Tensor> whole;
  for (const torch::Tensor& p : params) {
    std::vector<int64_t> shape = p.sizes().vec();
    shape[0] *= ep.size();
    whole.push_back(comm.all_gather(p.contiguous(), ep).reshape(shape));
  }
  return whole;
}

} // namespace meshsim
