// The mixture-of-experts feed-forward: routing, capacity, the balancing loss and the experts.
#include "models/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "memory/allocator.h"

namespace meshsim {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local double t_moe_loss_scale = 1.0;

// The softmax and the weights in float32 for 16-bit logits (as Mixtral's and DeepSeek's
// routers compute them), in the logits' dtype otherwise.
torch::ScalarType routing_type(const torch::Tensor& logits) {
  const auto t = logits.scalar_type();
  return t == torch::kHalf || t == torch::kBFloat16 ? torch::kFloat : t;
}

// The layer's output, carrying the balancing loss: forward returns `out` itself; backward
// passes out's gradient on and gives the loss the gradient `scale` (d loss / d aux).
struct CarryBalancingLoss : public torch::autograd::Function<CarryBalancingLoss> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& out,
                               const torch::Tensor& aux, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["aux_dtype"] = static_cast<int64_t>(aux.scalar_type());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["aux_dtype"].toInt());
    torch::Tensor d_aux;
    {
      GpuGuard host(nullptr); // a 0-dim argument, not GPU memory
      d_aux = torch::full({}, scale, torch::TensorOptions().dtype(dtype));
    }
    return {grads[0], d_aux.to(grads[0].device()), torch::Tensor()};
  }
};

void check_options(const MoeOptions& o) {
  if (o.hidden < 1 || o.experts < 1 || o.top_k < 1 || o.expert_ffn < 1 || o.shared_ffn < 0)
    throw std::invalid_argument(fmt::format(
        "moe: hidden, experts, top-k and the expert width must be positive, got {}, {}, {}, {}",
        o.hidden, o.experts, o.top_k, o.expert_ffn));
  if (o.top_k > o.experts)
    throw std::invalid_argument(
        fmt::format("moe: top-k {} is more than the {} experts", o.top_k, o.experts));
  if (o.groups < 1 || o.top_groups < 1 || o.top_groups > o.groups || o.experts % o.groups != 0 ||
      (o.groups > 1 && o.experts / o.groups < 2))
    throw std::invalid_argument(fmt::format(
        "moe: {} experts do not make {} groups of at least 2 of which to keep {}", o.experts,
        o.groups, o.top_groups));
  if (o.groups > 1 && o.router != MoeRouter::Sigmoid)
    throw std::invalid_argument("moe: group-limited routing is the sigmoid router's");
  if (o.groups > 1 && o.top_k > o.top_groups * (o.experts / o.groups))
    throw std::invalid_argument(fmt::format(
        "moe: top-k {} is more than the {} experts of the {} groups kept", o.top_k,
        o.top_groups * (o.experts / o.groups), o.top_groups));
  if (!(o.aux_loss >= 0) || !(o.capacity_factor >= 0) || !(o.routed_scale > 0))
    throw std::invalid_argument("moe: the balancing loss's coefficient and the capacity factor "
                                "must be at least 0, the routed scale positive");
}

// The chance that none of k distinct choices, each equally likely among `pool` experts, falls
// on `held` of them.
double misses(double pool, double held, int64_t k) {
  double p = 1;
  for (int64_t i = 0; i < k; ++i)
    p *= std::max(0.0, (pool - held - static_cast<double>(i)) / (pool - static_cast<double>(i)));
  return p;
}

// The number of ways to choose r of n (0 outside 0 <= r <= n).
double choose(int64_t n, int64_t r) {
  if (r < 0 || r > n)
    return 0.0;
  double c = 1;
  for (int64_t i = 1; i <= r; ++i)
    c = c * static_cast<double>(n - r + i) / static_cast<double>(i);
  return c;
}

} // namespace

std::vector<int64_t> planned_counts(const std::vector<double>& shares, int64_t experts,
                                    int64_t assignments) {
  if (!shares.empty() && static_cast<int64_t>(shares.size()) != experts)
    throw std::invalid_argument(fmt::format("moe: a planned routing of {} experts for a layer of {}",
                                            shares.size(), experts));
  std::vector<int64_t> counts(static_cast<size_t>(experts), 0);
  std::vector<std::pair<double, int64_t>> remainders;
  double total = 0;
  for (int64_t e = 0; e < experts; ++e)
    total += shares.empty() ? 1.0 : shares[static_cast<size_t>(e)];
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const double share = (shares.empty() ? 1.0 : shares[static_cast<size_t>(e)]) / total;
    const double exact = share * static_cast<double>(assignments);
    counts[static_cast<size_t>(e)] = static_cast<int64_t>(std::floor(exact));
    given += counts[static_cast<size_t>(e)];
    remainders.emplace_back(exact - std::floor(exact), e);
  }
  // The assignments rounding left go to the largest remainders (the first expert on a tie).
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < assignments; ++i, ++given)
    ++counts[static_cast<size_t>(remainders[i % remainders.size()].second)];
  return counts;
}

MoeRouter parse_moe_router(const std::string& name) {
  if (name == "softmax")
    return MoeRouter::Softmax;
  if (name == "sigmoid")
    return MoeRouter::Sigmoid;
  throw std::invalid_argument("unknown --moe-router '" + name + "' (choose softmax or sigmoid)");
}

std::string to_string(MoeRouter router) {
  return router == MoeRouter::Softmax ? "softmax" : "sigmoid";
}

MoeLossScale::MoeLossScale(double scale) : previous_(t_moe_loss_scale) {
  t_moe_loss_scale = scale;
}
MoeLossScale::~MoeLossScale() { t_moe_loss_scale = previous_; }
double MoeLossScale::current() { return t_moe_loss_scale; }

MoeRouting route_tokens(const torch::Tensor& logits, const MoeOptions& o,
                        const torch::Tensor& bias) {
  const torch::Tensor l = logits.to(routing_type(logits));
  MoeRouting r;
  if (o.router == MoeRouter::Softmax) {
    r.probabilities = torch::softmax(l, -1);
    auto [weights, experts] = r.probabilities.topk(o.top_k, -1);
    r.weights = weights, r.experts = experts;
  } else {
    const torch::Tensor scores = torch::sigmoid(l);
    torch::Tensor choice = scores.detach();
    if (bias.defined())
      choice = choice + bias.to(choice.scalar_type());
    if (o.groups > 1) {
      const int64_t n = choice.size(0), per_group = o.experts / o.groups;
      const torch::Tensor grouped = choice.view({n, o.groups, per_group});
      const torch::Tensor group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1); // [N, G]
      const torch::Tensor kept = std::get<1>(group_scores.topk(o.top_groups, -1));
      // The experts outside the kept groups (built as such: LibTorch 1.13's meta device has no
      // logical_not).
      const torch::Tensor outside = torch::ones_like(group_scores, torch::kBool)
                                        .scatter_(1, kept, false)
                                        .unsqueeze(-1)
                                        .expand({n, o.groups, per_group})
                                        .reshape({n, o.experts});
      choice = choice.masked_fill(outside, -std::numeric_limits<double>::infinity());
    }
    r.experts = std::get<1>(choice.topk(o.top_k, -1));
    r.weights = scores.gather(1, r.experts);
    r.probabilities = scores / scores.sum(-1, /*keepdim=*/true);
  }
  if (o.normalize_top_k)
    r.weights = r.weights / r.weights.sum(-1, /*keepdim=*/true);
  if (o.routed_scale != 1)
    r.weights = r.weights * o.routed_scale;
  return r;
}

int64_t expert_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts) {
  return static_cast<int64_t>(
      std::ceil(factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts)));
}

torch::Tensor capacity_keep(const torch::Tensor& experts, int64_t num_experts, int64_t capacity) {
  const torch::Tensor flat = experts.reshape({-1, 1}); // token-major, then choice
  const torch::Tensor chosen =
      torch::zeros({flat.size(0), num_experts}, experts.options()).scatter_(1, flat, 1);
  // Each assignment's place in its expert's queue: how many assignments to the same expert
  // came before it, itself included, less one.
  const torch::Tensor place = chosen.cumsum(0).gather(1, flat).sub_(1);
  return place.lt(capacity).view(experts.sizes());
}

torch::Tensor balancing_loss(const torch::Tensor& experts, const torch::Tensor& probabilities,
                             int64_t num_experts, int64_t sequence_length, double alpha,
                             const MoeSequenceParts& split) {
  const int64_t n = experts.size(0), k = experts.size(1);
  if (sequence_length < 1 || n % sequence_length != 0)
    throw std::invalid_argument(
        fmt::format("moe: {} tokens are not whole sequences of {}", n, sequence_length));
  const int64_t sequences = n / sequence_length, parts = split.parts;
  const torch::Tensor choices = experts.reshape({sequences, sequence_length * k});
  torch::Tensor counts =
      torch::zeros({sequences, num_experts}, probabilities.options())
          .scatter_add_(1, choices, torch::ones(choices.sizes(), probabilities.options()));
  if (parts > 1)
    split.sum(counts); // the whole sequence's choices
  const torch::Tensor fraction =
      counts / static_cast<double>(parts * sequence_length * k); // f, [S, E]
  torch::Tensor mean_probability =
      probabilities.view({sequences, sequence_length, num_experts}).mean(1); // P, [S, E]
  if (parts > 1)
    mean_probability = mean_probability / static_cast<double>(parts);
  return (fraction * mean_probability).sum(-1).mean() *
         (alpha * static_cast<double>(num_experts * parts));
}

double planned_reach(const MoeOptions& o, int64_t first, int64_t count) {
  if (first < 0 || count < 1 || first + count > o.experts)
    throw std::invalid_argument(
        fmt::format("moe: experts {} to {} are not of the {}", first, first + count - 1, o.experts));
  if (!o.planned_shares.empty() && static_cast<int64_t>(o.planned_shares.size()) != o.experts)
    throw std::invalid_argument(fmt::format("moe: a planned routing of {} experts for a layer of {}",
                                            o.planned_shares.size(), o.experts));
  const double experts = static_cast<double>(o.experts);
  double share = 0;
  for (int64_t e = first; e < first + count; ++e)
    share += o.planned_shares.empty() ? 1 / experts : o.planned_shares[static_cast<size_t>(e)];
  const double held = share * experts; // in experts' worth of the choices
  const int64_t size = o.experts / o.groups;
  if (o.groups > 1 && first / size == (first + count - 1) / size) {
    // Within one group: reached when the group is kept, and a choice among the kept groups'
    // experts falls on these.
    const double kept = static_cast<double>(o.top_groups) / static_cast<double>(o.groups);
    return kept * (1 - misses(static_cast<double>(o.top_groups * size), held, o.top_k));
  }
  if (o.groups > 1 && first % size == 0 && count % size == 0) {
    // Whole groups, g of them: m of them kept with the hypergeometric chance, then a choice
    // among the kept groups' experts falls on their m·size.
    const int64_t g = count / size, groups = o.groups, top = o.top_groups;
    double miss = 0;
    for (int64_t m = 0; m <= std::min(g, top); ++m)
      miss += choose(g, m) * choose(groups - g, top - m) / choose(groups, top) *
              misses(static_cast<double>(top * size), static_cast<double>(m * size), o.top_k);
    return 1 - miss;
  }
  return 1 - misses(experts, held, o.top_k);
}

MoeImpl::MoeImpl(const MoeOptions& o, const torch::TensorOptions& t) : options_(o) {
  check_options(o);
  router = register_parameter("router", torch::empty({o.experts, o.hidden}, t));
  expert_gate = register_parameter("expert_gate", torch::empty({o.experts, o.expert_ffn, o.hidden}, t));
  expert_up = register_parameter("expert_up", torch::empty({o.experts, o.expert_ffn, o.hidden}, t));
  expert_down = register_parameter("expert_down", torch::empty({o.experts, o.hidden, o.expert_ffn}, t));
  router_bias = register_buffer("router_bias", torch::zeros({o.experts}, t));
  if (o.shared_ffn > 0)
    shared_ = register_module("shared", std::make_shared<SwiGluMlpImpl>(o.hidden, o.shared_ffn, t));
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x) {
  const MoeOptions& o = options_;
  if (x.dim() != 3 || x.size(2) != o.hidden)
    throw std::invalid_argument("moe: expected x [B, T, " + std::to_string(o.hidden) + "], got " +
                                c10::str(x.sizes()));
  const int64_t tokens = x.size(0) * x.size(1);
  const torch::Tensor flat = x.reshape({tokens, o.hidden});
  const MoeRouting routing =
      route_tokens(torch::matmul(flat, router.t()), o,
                   o.router == MoeRouter::Sigmoid ? router_bias : torch::Tensor());
  // The assignments that run: every one, or those within their expert's capacity.
  torch::Tensor expert_of = routing.experts.reshape({-1});
  torch::Tensor token_of, weight_of = routing.weights.reshape({-1}).to(x.scalar_type());
  {
    GpuGuard host(nullptr); // indices, read by kernels as arguments
    token_of = torch::arange(tokens, torch::TensorOptions().dtype(torch::kLong))
                   .repeat_interleave(o.top_k)
                   .to(x.device());
  }
  // Meta tensors (plans) have no values to route: the counts are the planned routing's.
  const bool planned = x.is_meta();
  if (o.capacity_factor > 0 && !planned) {
    const torch::Tensor kept = capacity_keep(routing.experts, o.experts,
                                             expert_capacity(o.capacity_factor, tokens, o.top_k,
                                                             o.experts))
                                   .reshape({-1});
    expert_of = expert_of.masked_select(kept);
    token_of = token_of.masked_select(kept);
    weight_of = weight_of.masked_select(kept);
  }
  // Grouped by expert, each expert's tokens in token order.
  const torch::Tensor order = std::get<1>(expert_of.sort(/*stable=*/true, 0, /*descending=*/false));
  torch::Tensor rows = token_of.index_select(0, order);
  torch::Tensor weights = weight_of.index_select(0, order);
  {
    GpuGuard host(nullptr);
    if (planned) {
      std::vector<int64_t> counts = planned_counts(o.planned_shares, o.experts, tokens * o.top_k);
      if (o.capacity_factor > 0) {
        const int64_t capacity = expert_capacity(o.capacity_factor, tokens, o.top_k, o.experts);
        for (int64_t& n : counts)
          n = std::min(n, capacity);
      }
      tokens_per_expert_ = torch::tensor(counts, torch::kLong);
    } else {
      tokens_per_expert_ = torch::bincount(expert_of.cpu(), {}, o.experts);
    }
  }
  if (planned) { // the rows that run: all of them, or what the capacities leave
    const int64_t n = tokens_per_expert_.sum().item<int64_t>();
    rows = rows.narrow(0, 0, n);
    weights = weights.narrow(0, 0, n);
  }
  last_tokens_ = tokens;
  const MoeAssignments assignments{rows, weights, tokens_per_expert_};
  torch::Tensor out =
      dispatch_ ? dispatch_->run(*this, flat, assignments) : run_assignments(flat, assignments);
  if (shared_)
    out = out + shared_->forward(flat);
  if (o.aux_loss > 0 && is_training()) {
    const torch::Tensor aux = balancing_loss(routing.experts, routing.probabilities, o.experts,
                                             x.size(1), o.aux_loss, sequence_parts_);
    out = CarryBalancingLoss::apply(out, aux, MoeLossScale::current());
  }
  return out.view(x.sizes());
}

torch::Tensor MoeImpl::run_local_experts(const torch::Tensor& rows, const torch::Tensor& counts) {
  expert_load_ = counts;
  const auto* n_of = counts.data_ptr<int64_t>();
  std::vector<torch::Tensor> outputs;
  int64_t begin = 0;
  for (int64_t e = 0; e < counts.numel(); ++e) {
    const int64_t n = n_of[e];
    if (n == 0)
      continue;
    const torch::Tensor h = rows.narrow(0, begin, n);
    const torch::Tensor inner = torch::silu(torch::matmul(h, expert_gate[e].t())) *
                                torch::matmul(h, expert_up[e].t());
    outputs.push_back(torch::matmul(inner, expert_down[e].t()));
    begin += n;
  }
  // No rows: still an output of `rows`, so that backward reaches (and exchanges) them.
  return outputs.empty() ? rows * 0 : torch::cat(outputs);
}

torch::Tensor MoeImpl::run_assignments(const torch::Tensor& rows, const MoeAssignments& a) {
  last_rows_ = rows.size(0);
  const torch::Tensor out = run_local_experts(rows.index_select(0, a.token_of), a.counts);
  return torch::zeros_like(rows).index_add(
      0, a.token_of, a.weights.defined() ? out * a.weights.unsqueeze(1) : out);
}

void MoeImpl::keep_experts(int64_t first, int64_t count, std::shared_ptr<ExpertDispatch> dispatch) {
  const int64_t total = options_.experts;
  if (first < 0 || count < 1 || first + count > total || local_experts() != total)
    throw std::invalid_argument(fmt::format(
        "moe: cannot keep experts {} to {} of a layer holding {} of {}", first, first + count - 1,
        local_experts(), total));
  torch::NoGradGuard no_grad;
  for (const auto& [name, weight] : {std::pair{"expert_gate", &expert_gate},
                                      std::pair{"expert_up", &expert_up},
                                      std::pair{"expert_down", &expert_down}}) {
    *weight = weight->narrow(0, first, count).clone().requires_grad_(true);
    parameters_[name] = *weight;
  }
  first_expert_ = first;
  dispatch_ = std::move(dispatch);
}

void MoeImpl::add_routed_work(LayerWork& total, double eb) const {
  if (!tokens_per_expert_.defined())
    return;
  const double h = static_cast<double>(options_.hidden), f = static_cast<double>(options_.expert_ffn);
  const double e = static_cast<double>(options_.experts);
  const double tokens = static_cast<double>(last_tokens_);
  add_gemm(total, 2 * tokens * h * e, (tokens * h + tokens * e + e * h) * eb); // the router
  // Its softmax (or sigmoid) and top k, one kernel (Megatron's fused router): the logits read,
  // the probabilities written.
  add_elementwise(total, tokens * e, 5, 1, 1, eb);
  if (shared_)
    add_elementwise(total, tokens * h, 1, 2, 1, eb); // the shared experts' output added
  if (!expert_load_.defined())
    return;
  // The experts that ran and their tokens: each projection of them all is one grouped GEMM, as
  // the frameworks run them (Megatron's --moe-grouped-gemm, Transformer Engine's
  // GroupedLinear, torch._grouped_mm), each expert's GEMM a tile of the same kernel.
  const auto* counts = expert_load_.data_ptr<int64_t>();
  double n = 0, ran = 0;
  for (int64_t expert = 0; expert < expert_load_.numel(); ++expert) {
    n += static_cast<double>(counts[expert]);
    ran += counts[expert] > 0 ? 1 : 0;
  }
  if (n == 0)
    return;
  // gate and up (H -> F each), then down (F -> H), each reading the weights of the experts that
  // ran.
  for (int gemm = 0; gemm < 3; ++gemm)
    add_gemm(total, 2 * n * h * f, (n * h + n * f + ran * h * f) * eb);
  // The memory-bound kernels around them, one each as the frameworks' fused kernels run them
  // (Megatron's and Transformer Engine's permute and unpermute): the R rows that arrived
  // copied into expert order, one row an assignment; SwiGLU's SiLU and its product with up,
  // as a dense block's (mlp.cpp); each output times its weight and summed back into its row.
  const double rows = static_cast<double>(last_rows_);
  add_elementwise(total, n * h, 0, 1, 1, eb);                  // permute
  add_elementwise(total, n * f, 5, 1, 1, eb);                  // SiLU
  add_elementwise(total, n * f, 1, 2, 1, eb);                  // · up
  add_kernel(total, 2 * n * h, (n * h + n + rows * h) * eb);   // unpermute, weighted
  if (dispatch_)
    dispatch_->add_source_work(total, eb);
}

int64_t moe_parameter_count(const MoeOptions& o) {
  return o.experts * o.hidden + 3 * o.experts * o.hidden * o.expert_ffn +
         3 * o.hidden * o.shared_ffn;
}

} // namespace meshsim
