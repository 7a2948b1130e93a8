// Expert parallelism: the token exchange of every MoE layer (expert_parallel.h).
#include "parallel/expert/expert_parallel.h"

#include <memory>
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

class ExpertParallelDispatch final : public ExpertDispatch {
public:
  ExpertParallelDispatch(Communicator& comm, Group ep) : comm_(comm), ep_(std::move(ep)) {}

  torch::Tensor run(MoeImpl& layer, const torch::Tensor& rows,
                    const torch::Tensor& counts) override {
    const int ranks = ep_.size();
    const int64_t local = layer.local_experts();
    // 1. Counts: the rows for each of every rank's experts, [ep · local] in expert order;
    // back come, per source rank, its rows for each of mine.
    torch::Tensor received_counts;
    {
      CategoryScope scope(MemoryCategory::Communication);
      received_counts = comm_.all_to_all(counts.to(rows.device()), {}, {}, ep_);
    }
    if (rows.is_meta()) { // a plan: every rank routes as planned, so each sends me the same
      GpuGuard host(nullptr);
      received_counts = counts.narrow(0, layer.first_expert(), local).repeat({ranks});
    } else {
      received_counts = received_counts.cpu();
    }
    const auto* sent = counts.data_ptr<int64_t>();
    const auto* got = received_counts.data_ptr<int64_t>();
    std::vector<int64_t> send(static_cast<size_t>(ranks), 0), receive(static_cast<size_t>(ranks), 0);
    for (int r = 0; r < ranks; ++r)
      for (int64_t e = 0; e < local; ++e) {
        send[static_cast<size_t>(r)] += sent[r * local + e];
        receive[static_cast<size_t>(r)] += got[r * local + e];
      }
    // 2. Dispatch; the rows arrive by source, then expert: regrouped by expert, then source.
    const torch::Tensor arrived = AllToAllRows::apply(rows, send, receive, &comm_, ep_);
    std::vector<int64_t> by_expert;
    by_expert.reserve(static_cast<size_t>(arrived.size(0)));
    std::vector<int64_t> start(static_cast<size_t>(ranks * local), 0); // of (source, expert)
    for (int64_t i = 0, offset = 0; i < ranks * local; ++i) {
      start[static_cast<size_t>(i)] = offset;
      offset += got[i];
    }
    torch::Tensor load = torch::zeros({local}, torch::kLong);
    auto* per_expert = load.data_ptr<int64_t>();
    for (int64_t e = 0; e < local; ++e)
      for (int r = 0; r < ranks; ++r) {
        const int64_t cell = r * local + e;
        for (int64_t j = 0; j < got[cell]; ++j)
          by_expert.push_back(start[static_cast<size_t>(cell)] + j);
        per_expert[e] += got[cell];
      }
    torch::Tensor order, inverse;
    {
      GpuGuard host(nullptr); // indices, read by kernels as arguments
      order = torch::tensor(by_expert, torch::kLong);
      inverse = torch::empty_like(order).index_put_({order}, torch::arange(order.numel()));
    }
    const torch::Tensor grouped = arrived.index_select(0, order.to(rows.device()));
    const torch::Tensor out = layer.run_local_experts(grouped, load);
    // 3. Combine: back to source order, then to the sources.
    const torch::Tensor by_source = out.index_select(0, inverse.to(rows.device()));
    return AllToAllRows::apply(by_source, receive, send, &comm_, ep_);
  }

private:
  Communicator& comm_;
  Group ep_;
};

template <typename F>
void for_each_moe(const torch::nn::Sequential& model, F&& f) {
  for (const auto& module : model->modules(/*include_self=*/false))
    if (auto* moe = module->as<MoeImpl>())
      f(*moe);
}

} // namespace

void parallelize_experts(torch::nn::Sequential& model, Communicator& comm, const Group& ep) {
  const int index = ep.index_of(comm.rank());
  if (index < 0)
    throw std::invalid_argument("parallelize_experts: this rank is not in its ep group");
  auto dispatch = std::make_shared<ExpertParallelDispatch>(comm, ep);
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
