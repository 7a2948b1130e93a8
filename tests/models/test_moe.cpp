// The mixture-of-experts feed-forward (models/layers/moe.h) against its definitions: the two
// routers on hand-built logits, GShard's capacity on a hand-built routing, the layer against a
// token-by-token loop of plain ops (outputs and every gradient, float64, with shared experts,
// dropless and with a capacity), the balancing loss's gradient against adding the loss by hand,
// and the MoE Llama's parameter count against the built model.
//
// Tolerance 1e-12 (absolute, values of order 1 to 10): the layer and the loop compute the same
// sums of at most 2 experts' outputs of 16 features in float64 (unit roundoff 1.1e-16) in the
// same order up to the matmuls' blocking, a few ulps; a wrong weight, a token sent to the wrong
// expert or a dropped assignment that still ran changes a value by its own size.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <vector>

#include "models/layers/moe.h"
#include "models/llama.h"
#include "models/models.h"
#include "../python_torch.h"
#include "llama_reference.h"

using namespace meshsim;

namespace {

constexpr double kMoeTolerance = 1e-12;

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

torch::Tensor longs(std::vector<int64_t> v, std::vector<int64_t> shape) {
  return torch::tensor(v, torch::kLong).view(shape);
}

MoeOptions small_moe() {
  MoeOptions o;
  o.hidden = 6;
  o.experts = 4;
  o.top_k = 2;
  o.expert_ffn = 5;
  o.shared_ffn = 3;
  return o;
}

// One SwiGLU expert on one token: down(silu(gate x) · up x).
torch::Tensor swiglu(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                     const torch::Tensor& down) {
  return torch::matmul(down, torch::silu(torch::matmul(gate, x)) * torch::matmul(up, x));
}

// The layer token by token: each token's chosen experts (those `keep` keeps), weighted, plus the
// shared experts.
torch::Tensor loop_reference(MoeImpl& moe, const torch::Tensor& x, const torch::Tensor& keep) {
  const MoeOptions& o = moe.options();
  const torch::Tensor flat = x.reshape({-1, o.hidden});
  const MoeRouting r = route_tokens(torch::matmul(flat, moe.router.t()), o);
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < flat.size(0); ++t) {
    torch::Tensor y = torch::zeros({o.hidden}, flat.options());
    for (int64_t j = 0; j < o.top_k; ++j) {
      if (keep.defined() && !keep[t][j].item<bool>())
        continue;
      const int64_t e = r.experts[t][j].item<int64_t>();
      y = y + r.weights[t][j] * swiglu(flat[t], moe.expert_gate[e], moe.expert_up[e],
                                       moe.expert_down[e]);
    }
    rows.push_back(y);
  }
  torch::Tensor out = torch::stack(rows);
  for (const auto& child : moe.named_children())
    if (child.key() == "shared")
      out = out + child.value()->as<SwiGluMlpImpl>()->forward(flat);
  return out.view(x.sizes());
}

void randomize(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    p.normal_(0, 0.5);
}

// The MoE Llama of the PyTorch comparison: 3 layers, the first dense; 4 experts, top 2,
// shared experts, the balancing loss on.
TransformerShape pytorch_moe_llama() {
  TransformerShape s;
  s.layers = 3;
  s.hidden = 16;
  s.heads = 4;
  s.kv_heads = 2;
  s.ffn_hidden = 24;
  s.seq_len = 16;
  s.vocab = 64;
  s.moe.experts = 4;
  s.moe.top_k = 2;
  s.moe.ffn = 8;
  s.moe.shared_ffn = 12;
  s.moe.dense_layers = 1;
  s.moe.aux_loss = 0.1;
  return s;
}

} // namespace

// Softmax: the top 2 of softmax(logits), renormalised; without renormalisation, the raw
// probabilities.
TEST(MoeRouting, SoftmaxTakesTheTopKProbabilities) {
  MoeOptions o = small_moe();
  const torch::Tensor logits =
      torch::tensor({1.0, 3.0, 2.0, 0.0, 0.5, 0.1, 0.2, 4.0}, torch::kFloat64).view({2, 4});
  const MoeRouting r = route_tokens(logits, o);
  EXPECT_TRUE(r.experts.equal(longs({1, 2, 3, 0}, {2, 2})));
  const torch::Tensor p = torch::softmax(logits, -1);
  const double a = p[0][1].item<double>(), b = p[0][2].item<double>();
  EXPECT_NEAR(r.weights[0][0].item<double>(), a / (a + b), kMoeTolerance);
  EXPECT_NEAR(r.weights[0][1].item<double>(), b / (a + b), kMoeTolerance);
  o.normalize_top_k = false;
  EXPECT_NEAR(route_tokens(logits, o).weights[0][0].item<double>(), a, kMoeTolerance);
}

// Sigmoid with groups: 8 experts in 4 groups of 2, the best 2 groups kept (a group scores the
// sum of its two scores); the bias steers the choice but not the weights.
TEST(MoeRouting, SigmoidChoosesWithinTheBestGroupsAndWeighsWithoutTheBias) {
  MoeOptions o = small_moe();
  o.experts = 8;
  o.router = MoeRouter::Sigmoid;
  o.groups = 4;
  o.top_groups = 2;
  o.routed_scale = 2.5;
  // Expert 0 has the single best score, but its group (0, 1) sums lower than groups (2, 3)
  // and (4, 5); group (6, 7) is the lowest.
  const torch::Tensor logits =
      torch::tensor({3.0, -4.0, 1.0, 0.8, 2.0, 0.5, -1.0, -1.0}, torch::kFloat64).view({1, 8});
  MoeRouting r = route_tokens(logits, o);
  EXPECT_TRUE(r.experts.equal(longs({4, 2}, {1, 2}))) << r.experts;
  const torch::Tensor s = torch::sigmoid(logits)[0];
  const double s4 = s[4].item<double>(), s2 = s[2].item<double>();
  EXPECT_NEAR(r.weights[0][0].item<double>(), 2.5 * s4 / (s4 + s2), kMoeTolerance);
  // A bias on expert 3 moves the choice to it; the weight stays its unbiased score.
  const torch::Tensor bias = torch::tensor({0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0}, torch::kFloat64);
  r = route_tokens(logits, o, bias);
  EXPECT_TRUE(r.experts.equal(longs({3, 4}, {1, 2}))) << r.experts;
  const double s3 = s[3].item<double>();
  EXPECT_NEAR(r.weights[0][0].item<double>(), 2.5 * s3 / (s3 + s4), kMoeTolerance);
}

// GShard's capacity on a hand-built routing of 4 tokens, 2 choices each, 3 experts of room 2:
// each expert keeps its first two assignments in token order.
TEST(MoeCapacity, EachExpertKeepsItsFirstAssignmentsInTokenOrder) {
  const torch::Tensor experts = longs({0, 1, 0, 2, 0, 1, 1, 0}, {4, 2});
  const torch::Tensor want =
      torch::tensor({true, true, true, true, false, true, false, false}).view({4, 2});
  EXPECT_TRUE(capacity_keep(experts, 3, 2).equal(want)) << capacity_keep(experts, 3, 2);
  EXPECT_TRUE(capacity_keep(experts, 3, 4).all().item<bool>());
  EXPECT_EQ(expert_capacity(1.0, 4, 2, 3), 3);   // ceil(8 / 3)
  EXPECT_EQ(expert_capacity(1.25, 16, 2, 4), 10); // ceil(1.25 · 32 / 4)
}



// The layer against the loop: outputs and the gradients of x and of every parameter, dropless
// and with capacity factor 0.5 (each expert takes at most 1 of the 8 assignments of 4 tokens).
// planned_reach against counting: every way of choosing equally likely (all pairs of groups,
// then all sets of k experts among the kept groups' experts), the fraction that choose any of
// the experts held.
double counted_reach(int64_t experts, int64_t k, int64_t groups, int64_t top_groups,
                     int64_t first, int64_t count) {
  const int64_t size = experts / groups;
  double reached = 0, ways = 0;
  for (int64_t kept = 0; kept < (int64_t{1} << groups); ++kept) {
    if (__builtin_popcountll(static_cast<unsigned long long>(kept)) != top_groups)
      continue;
    std::vector<int64_t> pool;
    for (int64_t e = 0; e < experts; ++e)
      if (kept >> (e / size) & 1)
        pool.push_back(e);
    const int64_t n = static_cast<int64_t>(pool.size());
    for (int64_t chosen = 0; chosen < (int64_t{1} << n); ++chosen) {
      if (__builtin_popcountll(static_cast<unsigned long long>(chosen)) != k)
        continue;
      bool hit = false;
      for (int64_t i = 0; i < n; ++i)
        hit = hit || (chosen >> i & 1 && pool[static_cast<size_t>(i)] >= first &&
                      pool[static_cast<size_t>(i)] < first + count);
      // Each kept set of groups is equally likely, then each choice within it.
      double per_set = 1;
      for (int64_t i = 0; i < k; ++i)
        per_set = per_set * static_cast<double>(i + 1) / static_cast<double>(n - i);
      ways += per_set;
      reached += hit ? per_set : 0;
    }
  }
  return reached / ways;
}

TEST(MoePlannedReach, IsTheShareOfChoicesThatReachTheExpertsCounted) {
  MoeOptions o;
  o.hidden = 4;
  o.expert_ffn = 4;
  // Without groups: 8 experts, top 3; one, two and four experts held.
  o.experts = 8;
  o.top_k = 3;
  for (int64_t count : {1, 2, 4})
    EXPECT_NEAR(planned_reach(o, 0, count), counted_reach(8, 3, 1, 1, 0, count), 1e-12) << count;
  // Group-limited: 12 experts in 4 groups of 3, the best 2 kept, top 3: within one group,
  // and whole groups.
  o.router = MoeRouter::Sigmoid;
  o.experts = 12;
  o.groups = 4;
  o.top_groups = 2;
  for (auto [first, count] : {std::pair{0, 1}, {3, 3}, {4, 2}, {0, 6}, {6, 6}})
    EXPECT_NEAR(planned_reach(o, first, count), counted_reach(12, 3, 4, 2, first, count), 1e-12)
        << first << " " << count;
  // Qwen3-30B-A3B over ep 8: a token reaches 5.339 of the 8 ranks (8 · (1 − C(112,8)/C(128,8))).
  MoeOptions qwen;
  qwen.hidden = qwen.expert_ffn = 4;
  qwen.experts = 128;
  qwen.top_k = 8;
  EXPECT_NEAR(8 * planned_reach(qwen, 0, 16), 5.3394, 1e-4);
  EXPECT_THROW(planned_reach(qwen, 120, 16), std::invalid_argument);
}

TEST(MoeLayer, MatchesATokenByTokenLoop) {
  for (double capacity : {0.0, 0.5}) {
    torch::manual_seed(3);
    MoeOptions o = small_moe();
    o.capacity_factor = capacity;
    Moe moe(o, torch::TensorOptions().dtype(torch::kFloat64));
    randomize(*moe);
    const torch::Tensor x = torch::randn({2, 2, o.hidden}, torch::kFloat64).requires_grad_(true);
    const torch::Tensor g = torch::randn({2, 2, o.hidden}, torch::kFloat64);
    const torch::Tensor got = moe->forward(x);
    std::vector<torch::Tensor> inputs{x};
    for (const auto& p : moe->parameters())
      inputs.push_back(p);
    const auto got_grads = torch::autograd::grad({got}, inputs, {g});
    torch::Tensor keep;
    if (capacity > 0) {
      const MoeRouting r =
          route_tokens(torch::matmul(x.reshape({-1, o.hidden}), moe->router.t()), o);
      keep = capacity_keep(r.experts, o.experts, expert_capacity(capacity, 4, 2, 4));
      EXPECT_EQ(expert_capacity(capacity, 4, 2, 4), 1);
      EXPECT_FALSE(keep.all().item<bool>()) << "the capacity must drop something here";
    }
    const torch::Tensor want = loop_reference(*moe, x, keep);
    const auto want_grads = torch::autograd::grad({want}, inputs, {g});
    EXPECT_LE(max_difference(got, want), kMoeTolerance) << "capacity " << capacity;
    for (size_t i = 0; i < inputs.size(); ++i)
      EXPECT_LE(max_difference(got_grads[i], want_grads[i]), kMoeTolerance)
          << "capacity " << capacity << " input " << i;
    // The tokens the experts ran: the 8 assignments dropless, those kept with a capacity.
    EXPECT_EQ(moe->tokens_per_expert().sum().item<int64_t>(),
              capacity > 0 ? keep.sum().item<int64_t>() : 8);
    if (capacity > 0) {
      EXPECT_LE(moe->tokens_per_expert().max().item<int64_t>(), 1);
    }
  }
}

// The routed experts are counted as the frameworks run them: each projection (gate, up, down)
// of every expert that ran is one grouped GEMM, 2·N·H·F FLOPs over the N assignments, reading
// the N rows, writing theirs and reading the weights of the experts that ran; the router is a
// GEMM of its own; around them, one fused kernel each for the router's softmax and top k, the
// permutation, SwiGLU's two steps and the weighted unpermutation (flops.h). 4 tokens of 6
// features, top 2 of 4 experts of width 5, float64.
TEST(MoeLayer, ItsRoutedExpertsAreOneGroupedGemmAProjection) {
  torch::manual_seed(5);
  const MoeOptions o = small_moe();
  Moe moe(o, torch::TensorOptions().dtype(torch::kFloat64));
  randomize(*moe);
  moe->forward(torch::randn({2, 2, o.hidden}, torch::kFloat64));
  LayerWork w;
  moe->add_routed_work(w, 8);
  const torch::Tensor load = moe->tokens_per_expert();
  const double n = static_cast<double>(load.sum().item<int64_t>()); // 8 assignments
  const double ran = static_cast<double>((load > 0).sum().item<int64_t>());
  const double h = 6, f = 5, e = 4, tokens = 4;
  EXPECT_EQ(n, 8);
  EXPECT_EQ(w.gemms, 4);   // the router and the three projections, whatever the experts
  EXPECT_DOUBLE_EQ(w.gemm_flops, 2 * tokens * h * e + 3 * 2 * n * h * f);
  EXPECT_DOUBLE_EQ(w.gemm_bytes,
                   (tokens * h + tokens * e + e * h) * 8 + 3 * (n * h + n * f + ran * h * f) * 8);
  // Six memory-bound kernels: the router's softmax and top k, the shared experts' output
  // added, the permutation into expert order, SiLU, the product with up, and the weighted sum
  // back into the 4 tokens (the shared experts' own kernels are counted as any MLP's).
  EXPECT_EQ(w.kernels, 4 + 6);
  EXPECT_DOUBLE_EQ(w.flops - w.gemm_flops,
                   5 * tokens * e + tokens * h + 5 * n * f + n * f + 2 * n * h);
  EXPECT_DOUBLE_EQ(w.bytes - w.gemm_bytes, (2 * tokens * e + 3 * tokens * h + 2 * n * h +
                                            2 * n * f + 3 * n * f + n * h + n + tokens * h) *
                                               8);
}

// The balancing loss reaches the router through the layer's output: its gradients equal those
// of the output plus the loss computed by hand (per sequence, Switch's α·E·Σ f·P, averaged),
// and a loss scale multiplies the loss's part as it multiplies the rest.
TEST(MoeLayer, TheBalancingLossReachesTheRouterAsIfAddedToTheLoss) {
  torch::manual_seed(4);
  MoeOptions o = small_moe();
  o.aux_loss = 0.3;
  Moe moe(o, torch::TensorOptions().dtype(torch::kFloat64));
  randomize(*moe);
  const torch::Tensor x = torch::randn({3, 4, o.hidden}, torch::kFloat64);
  const torch::Tensor g = torch::randn({3, 4, o.hidden}, torch::kFloat64);
  for (double scale : {1.0, 8.0}) {
    moe->zero_grad();
    {
      const MoeLossScale loss_scale(scale);
      (moe->forward(x) * g).sum().mul(scale).backward();
    }
    const torch::Tensor got = moe->router.grad().clone();
    moe->zero_grad();
    const MoeRouting r =
        route_tokens(torch::matmul(x.reshape({-1, o.hidden}), moe->router.t()), o);
    torch::Tensor by_hand = torch::zeros({}, torch::kFloat64);
    for (int64_t s = 0; s < 3; ++s) { // sequence s: tokens 4s .. 4s+3
      const torch::Tensor e = r.experts.narrow(0, 4 * s, 4).reshape({-1});
      const torch::Tensor f = torch::bincount(e, {}, o.experts).to(torch::kFloat64) / 8.0;
      const torch::Tensor p = r.probabilities.narrow(0, 4 * s, 4).mean(0);
      by_hand = by_hand + 0.3 * 4 * (f * p).sum() / 3.0;
    }
    moe->eval(); // no balancing loss outside training: the output alone
    ((moe->forward(x) * g).sum() + by_hand).mul(scale).backward();
    moe->train();
    EXPECT_LE(max_difference(got, moe->router.grad()), kMoeTolerance * scale) << "scale " << scale;
    EXPECT_NEAR(by_hand.item<double>(),
                balancing_loss(r.experts, r.probabilities, o.experts, 4, 0.3).item<double>(),
                kMoeTolerance);
  }
}

// The MoE Llama (dense first layer, MoE after it, with shared experts): its parameter count is
// the built model's, on the CPU and on meta, and every parameter gets a gradient.
TEST(MoeLlama, ParameterCountIsTheBuiltModels) {
  const TransformerShape s = pytorch_moe_llama();
  ModelOptions options;
  options.shape = s;
  torch::nn::Sequential model = build_model("llama", options);
  EXPECT_EQ(count_parameters(*model), llama_parameter_count(s));
  int moe_layers = 0;
  for (const auto& m : model->modules(false))
    moe_layers += m->as<MoeImpl>() != nullptr;
  EXPECT_EQ(moe_layers, 2);
  const torch::Tensor tokens = torch::randint(0, s.vocab, {2, 8}, torch::kLong);
  model->forward(tokens).sum().backward();
  for (const auto& p : model->named_parameters())
    EXPECT_TRUE(p.value().grad().defined()) << p.key();
  ModelOptions meta = options;
  meta.device = torch::kMeta;
  EXPECT_EQ(count_parameters(*build_model("llama", meta)), llama_parameter_count(s));
}

// The MoE Llama against PyTorch (reference_llama.py, Mixtral's way of running experts): the
// same init, float64, the language-model loss, every logit, and every gradient of that loss
// plus the balancing losses, within kFloat64ModelTolerance (llama_reference.h).
TEST(MoeLlama, LogitsLossAndGradientsMatchPyTorch) {
  if (!meshsim::testing::python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  const auto r = meshsim::testing::expect_llama_matches_pytorch(pytorch_moe_llama(), "moe llama");
  std::cout << "moe llama vs PyTorch, float64: loss " << r.loss << ", logits rel. error "
            << r.logit_error << ", worst gradient rel. error " << r.grad_error << "\n";
}
