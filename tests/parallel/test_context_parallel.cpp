// Context parallelism against single-device training of the same global batches, for the GPT
// and the Llama (grouped-query attention: 4 query heads, 2 kv heads): loss per step and final
// gathered parameters within kFloat64Tolerance relative (derived in strategy_harness.h: the
// layouts only reorder sums, so float64 runs agree to rounding amplified by training), SGD
// with momentum over 10 steps. Layouts: cp 2 and 4 with each --cp-comm, dp × cp, cp × tp
// with sequence parallel, cp × pp × dp with ZeRO 1, ZeRO 2 and 3 over dp_shard_cp, and
// recompute; and with dropout, each layout against the single device with the same dropout.
// Also the partial attention against the eager causal core, the merge of two blocks by
// log-sum-exp, rows that see no key, and the chunks each rank holds.
#include <gtest/gtest.h>

#include <iostream>
#include <limits>

#include "data/text.h"
#include "models/layers/eager_core.h"
#include "models/layers/partial_attention.h"
#include "parallel/context/context_parallel.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kCpSteps = 10;
constexpr int64_t kCpGlobalBatch = 8;

StrategyOptions cp_model(const std::string& model) {
  StrategyOptions o;
  o.model = model;
  o.seed = 13;
  o.shape.layers = 2;
  o.shape.hidden = 16;
  o.shape.heads = 4;
  o.shape.kv_heads = model == "llama" ? 2 : 0;
  o.shape.ffn_hidden = 32;
  o.shape.seq_len = 16;
  o.shape.vocab = 64;
  o.optimizer.name = "sgd";
  o.optimizer.lr = 0.1;
  o.optimizer.momentum = 0.9;
  o.dtype = torch::kFloat64;
  return o;
}

const Dataset& cp_text() {
  static const Dataset data = synthetic_text(256, 16, 16, 64, 5).train;
  return data;
}

HarnessRun run_cp(int world, const std::string& strategy, const StrategyOptions& options) {
  static std::vector<std::unique_ptr<DeviceMesh>> meshes; // outlive the returned runs
  meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(world, int64_t{1} << 30)));
  torch::manual_seed(5); // the same permutation of the data for every run
  return run_strategy(*meshes.back(), strategy, options, cp_text(), kCpGlobalBatch, kCpSteps);
}

struct Layout {
  int world, cp, tp, pp, zero, micro_batches;
  std::string comm;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  AttentionKind attention = AttentionKind::Eager; // each block's kernel (the reference: eager)
};

std::string describe(const Layout& l) {
  std::string s = "cp" + std::to_string(l.cp) + " " + l.comm;
  const int dp = l.world / (l.cp * l.tp * l.pp);
  if (dp > 1) s += " dp" + std::to_string(dp);
  if (l.tp > 1) s += " tp" + std::to_string(l.tp) + (l.sequence_parallel ? " sp" : "");
  if (l.pp > 1) s += " pp" + std::to_string(l.pp);
  if (l.zero > 0) s += " zero" + std::to_string(l.zero);
  if (l.recompute != Recompute::None)
    s += l.recompute == Recompute::Full ? " full recompute"
         : l.recompute == Recompute::Op ? " op recompute"
                                         : " selective recompute";
  if (l.attention == AttentionKind::Fused) s += " fused";
  return s;
}

void expect_layouts_match_single(const std::string& model, const std::vector<Layout>& layouts,
                                 double dropout = 0) {
  StrategyOptions single = cp_model(model);
  single.shape.dropout = dropout;
  const HarnessRun ref = run_cp(1, "single", single);
  if (dropout > 0) {  // dropout must have changed the run, or the comparisons prove nothing
    const HarnessRun none = run_cp(1, "single", cp_model(model));
    EXPECT_GT(std::abs(ref.losses.back() - none.losses.back()), 1e-4 * std::abs(none.losses.back()))
        << model << ": dropout " << dropout << " trains as dropout 0";
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << model << ": the reference did not learn";
  for (const Layout& l : layouts) {
    StrategyOptions o = cp_model(model);
    o.cp = l.cp;
    o.cp_comm = l.comm;
    o.tp = l.tp;
    o.pp = l.pp;
    o.zero = l.zero;
    o.micro_batches = l.micro_batches;
    o.sequence_parallel = l.sequence_parallel;
    o.recompute = l.recompute;
    o.attention = l.attention;
    o.shape.dropout = dropout;
    const std::string what =
        model + " " + describe(l) + (dropout > 0 ? " with dropout" : "");
    const HarnessRun got = run_cp(l.world, "ddp", o);
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
    for (int k = 0; k < kCpSteps; ++k)
      EXPECT_NEAR(got.losses[k], ref.losses[k], kFloat64Tolerance * std::abs(ref.losses[k]))
          << what << " step " << k + 1;
    ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < ref.parameters.size(); ++i) {
      ASSERT_EQ(got.parameters[i].sizes(), ref.parameters[i].sizes()) << what << " parameter " << i;
      // The floor: the GPT's key bias gets no gradient (strategy_harness.h).
      const double e = relative_error(got.parameters[i], ref.parameters[i], 1e-5);
      EXPECT_LT(e, kFloat64Tolerance) << what << " parameter " << i;
      worst = std::max(worst, e);
    }
    std::cout << what << ": final loss " << got.losses.back() << " (single " << ref.losses.back()
              << "), worst parameter rel. error " << worst << "\n";
  }
}

std::vector<Layout> every_layout() {
  std::vector<Layout> out;
  for (const std::string comm : {"allgather", "ring"}) {
    out.push_back({2, 2, 1, 1, 0, 1, comm});
    out.push_back({4, 4, 1, 1, 0, 1, comm});
    out.push_back({4, 2, 1, 1, 0, 1, comm});                        // dp 2 × cp 2
    out.push_back({4, 2, 2, 1, 0, 1, comm, /*sequence_parallel=*/true});
    out.push_back({8, 2, 1, 2, 1, 2, comm});                        // dp 2 × cp 2 × pp 2, zero 1
  }
  out.push_back({4, 2, 1, 1, 3, 1, "ring"});  // ZeRO 3 over dp_shard_cp (dp 2 × cp 2)
  out.push_back({4, 2, 1, 1, 2, 1, "allgather"});  // ZeRO 2 over it
  out.push_back({2, 2, 1, 1, 0, 1, "ring", false, Recompute::Full});
  out.push_back({2, 2, 1, 1, 0, 1, "allgather", false, Recompute::Selective});
  // FSDP with a pipeline and context parallelism (dp 2 × cp 2 × pp 2, ZeRO 3), and the blocks
  // run by the fused kernel (fused_core.h) against the eager single-device reference.
  out.push_back({8, 2, 1, 2, 3, 2, "allgather"});
  out.push_back({8, 2, 1, 2, 3, 2, "ring", false, Recompute::None, AttentionKind::Fused});
  out.push_back({4, 4, 1, 1, 0, 1, "ring", false, Recompute::None, AttentionKind::Fused});
  out.push_back({4, 2, 2, 1, 1, 1, "allgather", true, Recompute::None, AttentionKind::Fused});
  // Op-level recompute: the allgather core's fused kernel keeps its output, the ring's blocks
  // (merged in place) run again.
  out.push_back({2, 2, 1, 1, 0, 1, "ring", false, Recompute::Op, AttentionKind::Fused});
  out.push_back({4, 2, 1, 1, 3, 1, "allgather", false, Recompute::Op, AttentionKind::Fused});
  return out;
}

// With dropout: each rank's blocks draw the mask of their queries' and keys' true positions
// (models/layers/dropout.h), with the eager and the fused kernel, both cores, sequence
// parallelism, a pipeline with ZeRO and full recompute.
std::vector<Layout> dropout_layouts() {
  return {
      {2, 2, 1, 1, 0, 1, "ring"},
      {2, 2, 1, 1, 0, 1, "allgather", false, Recompute::None, AttentionKind::Fused},
      {4, 4, 1, 1, 0, 1, "ring", false, Recompute::None, AttentionKind::Fused},
      {4, 2, 2, 1, 1, 1, "allgather", true, Recompute::None, AttentionKind::Fused},
      {4, 2, 2, 1, 0, 1, "ring", true, Recompute::Selective},
      {8, 2, 1, 2, 1, 2, "ring", false, Recompute::Full, AttentionKind::Fused},
  };
}

} // namespace

TEST(ContextParallel, GptMatchesSingleDevice) { expect_layouts_match_single("gpt", every_layout()); }

TEST(ContextParallel, LlamaMatchesSingleDevice) {
  expect_layouts_match_single("llama", every_layout());
}

TEST(ContextParallel, WithDropoutGptAndLlamaMatchSingleDevice) {
  expect_layouts_match_single("gpt", dropout_layouts(), 0.1);
  expect_layouts_match_single("llama", dropout_layouts(), 0.1);
}

// Rank r of cp C holds chunks r and 2C-1-r of 2C: for T = 16 and C = 4, chunks of 2.
TEST(ContextParallel, EachRankHoldsTwoBalancedChunks) {
  const auto longs = torch::TensorOptions().dtype(torch::kLong);
  EXPECT_TRUE(cp_positions(16, 4, 0, longs).equal(torch::tensor({0, 1, 14, 15}, longs)));
  EXPECT_TRUE(cp_positions(16, 4, 1, longs).equal(torch::tensor({2, 3, 12, 13}, longs)));
  EXPECT_TRUE(cp_positions(16, 4, 3, longs).equal(torch::tensor({6, 7, 8, 9}, longs)));
  const torch::Tensor tokens = torch::arange(32, longs).view({2, 16});
  EXPECT_TRUE(cp_shard_sequence(tokens, 4, 1).equal(
      torch::tensor({2, 3, 12, 13, 18, 19, 28, 29}, longs).view({2, 4})));
  EXPECT_THROW(cp_positions(12, 4, 0, longs), std::invalid_argument);
}

// The reference partial attention: over all keys it is the eager causal core; over two blocks
// merged by log-sum-exp it is the same again; a query that sees no key gets out 0, lse -inf
// and zero gradients. Tolerance: float64, a handful of operations per element, so agreement
// to 1e-12 relative (unit roundoff 1.1e-16 times far fewer than 1e4 operations).
TEST(ContextParallel, PartialAttentionMergesExactly) {
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor q = torch::randn({2, 3, 8, 4}, f64).requires_grad_(true);
  const torch::Tensor k = torch::randn({2, 3, 8, 4}, f64).requires_grad_(true);
  const torch::Tensor v = torch::randn({2, 3, 8, 4}, f64).requires_grad_(true);
  const torch::Tensor pos = torch::arange(8, f64.dtype(torch::kLong));
  const torch::Tensor eager = causal_attention(q, k, v, pos);
  const BlockAttention all = partial_attention_reference(q, k, v, pos, pos);
  EXPECT_LT(relative_error(all.out, eager), 1e-12);
  // Two blocks of keys, merged.
  const BlockAttention a = partial_attention_reference(q, k.narrow(2, 0, 4), v.narrow(2, 0, 4),
                                                       pos, pos.narrow(0, 0, 4));
  const BlockAttention b = partial_attention_reference(q, k.narrow(2, 4, 4), v.narrow(2, 4, 4),
                                                       pos, pos.narrow(0, 4, 4));
  // Queries 0-3 see nothing of the second block.
  EXPECT_TRUE(b.lse.narrow(2, 0, 4).isinf().all().item<bool>());
  EXPECT_EQ(b.out.narrow(2, 0, 4).abs().max().item<double>(), 0.0);
  const torch::Tensor lse = torch::logaddexp(a.lse, b.lse);
  const torch::Tensor merged = a.out * torch::exp(a.lse - lse).unsqueeze(-1) +
                               b.out * torch::exp(b.lse - lse).unsqueeze(-1);
  EXPECT_LT(relative_error(merged, eager), 1e-12);
  EXPECT_LT(relative_error(lse, all.lse), 1e-12);
  // Gradients through the merge (out and lse both) equal the eager core's.
  const torch::Tensor w = torch::randn({2, 3, 8, 4}, f64);
  const auto g_merged = torch::autograd::grad({(merged * w).sum()}, {q, k, v});
  const auto g_eager = torch::autograd::grad({(eager * w).sum()}, {q, k, v});
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(relative_error(g_merged[i], g_eager[i]), 1e-12) << "gradient " << i;
  // A block no query sees: finite zero gradients, nothing NaN.
  const BlockAttention none = partial_attention_reference(q.narrow(2, 0, 4), k.narrow(2, 4, 4),
                                                          v.narrow(2, 4, 4), pos.narrow(0, 0, 4),
                                                          pos.narrow(0, 4, 4));
  const auto g_none = torch::autograd::grad({none.out.sum() + none.lse.clamp_min(-1e3).sum()},
                                            {q, k, v}, {}, false, false, /*allow_unused=*/true);
  for (const auto& g : g_none)
    if (g.defined()) {
      EXPECT_EQ(g.abs().max().item<double>(), 0.0);
    }
}
