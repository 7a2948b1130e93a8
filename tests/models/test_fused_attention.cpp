// The fused attention core (models/layers/fused_core.h) against the eager one and against an
// autograd reference made of plain ops: whole tiny GPTs and Llamas in float64 (losses and every
// gradient), with and without grouped-query attention, in one tile or several (a sequence
// that the tile does not divide); fused_attention() at separate query and key positions, with
// gradients through its log-sum-exp, rows that see no key, and two partial results merged by
// their log-sum-exp; and the whole models and merged blocks again with dropout on the
// probabilities, where the fused core must drop what the eager one drops.
//
// Tolerance 1e-9 (absolute, on values of order 1e-3 to 10): both cores compute the same
// softmax in float64 (unit roundoff u = 1.1e-16) in different orders (the eager core
// normalizes by the max and the sum, the fused one by exp(S - logsumexp(S)), tile by tile),
// so each value differs by a few u times the sums it came from: at most 16 keys, 32 features,
// 64 logits and 2 layers here, well under 1e4 · u ≈ 1e-12 relative. 1e-9 leaves three orders
// of margin for that and none for a mistake: a missing term of dS, a wrong mask entry or a
// gradient through lse left out changes a value by its own size (1e-4 and above here).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "models/layers/attention.h"
#include "models/layers/dropout.h"
#include "models/layers/eager_core.h"
#include "models/layers/fused_core.h"
#include "models/layers/partial_attention.h"
#include "models/models.h"
#include "parallel/strategy.h"

using namespace meshsim;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace fused_test {

constexpr double kFusedTolerance = 1e-9;

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TransformerShape tiny(int64_t kv_heads) {
  TransformerShape o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.kv_heads = kv_heads;
  o.seq_len = 16;
  o.vocab = 64;
  return o;
}

// The loss and every gradient of `model` (built in float64 with `core` in every attention)
// on fixed tokens.
struct LossAndGradients {
  double loss = 0;
  std::vector<torch::Tensor> grads;
};

// With `dropout` > 0 the model trains with it: the forward runs under a draw of step 1 for
// rows 0..3, and backward after the draw's scope has closed (as a strategy's does), so the
// fused core must regenerate its masks from what it saved.
LossAndGradients run_model(const std::string& name, const TransformerShape& shape,
                           AttentionKind kind, int64_t tile_rows, double dropout = 0) {
  ModelOptions options;
  options.seed = 7;
  options.shape = shape;
  options.shape.dropout = dropout;
  options.dtype = torch::kFloat64;
  options.attention = kind;
  torch::nn::Sequential model = build_model(name, options);
  int attentions = 0;
  for (const auto& module : model->modules(false))
    if (auto* attention = dynamic_cast<AttentionImpl*>(module.get())) {
      EXPECT_EQ(attention->core().fused(), kind == AttentionKind::Fused);
      if (kind == AttentionKind::Fused && tile_rows > 0)
        attention->set_core(std::make_shared<FusedCausalCore>(tile_rows));
      ++attentions;
    }
  EXPECT_EQ(attentions, shape.layers);
  const torch::Tensor tokens = torch::arange(4 * shape.seq_len, torch::kLong)
                                   .mul(37)
                                   .remainder(shape.vocab)
                                   .view({4, shape.seq_len});
  const torch::Tensor targets = tokens.roll(-1, 1);
  torch::Tensor loss;
  {
    auto draw = std::make_shared<DropoutDraw>();
    draw->seed = 3;
    draw->step = 1;
    draw->samples = torch::arange(4, torch::kLong);
    const DropoutScope scope(dropout > 0 ? draw : nullptr);
    loss = loss_fn(model->forward(tokens), targets);
  }
  loss.backward();
  LossAndGradients out{loss.item<double>(), {}};
  for (const torch::Tensor& p : model->parameters())
    out.grads.push_back(p.grad().clone());
  return out;
}

// Plain-op reference of fused_attention: masked scores, logsumexp, softmax, times v.
PartialAttention plain_attention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const torch::Tensor& qp,
                                 const torch::Tensor& kp) {
  const torch::Tensor s =
      torch::matmul(q, k.transpose(-2, -1)).div(std::sqrt(static_cast<double>(q.size(3))))
          .masked_fill(kp.unsqueeze(0) > qp.unsqueeze(1), -std::numeric_limits<double>::infinity());
  const torch::Tensor lse = s.logsumexp(-1);
  return {torch::matmul(torch::softmax(s, -1), v), lse};
}

// Whole models with `dropout` (0: none): the fused core in one tile (128 rows > 16 tokens),
// in tiles of 3 rows (six tiles, the last of one row) and of 5 (four, the last of one row),
// against the eager core, for the GPT and the Llama with and without grouped-query attention.
void expect_fused_matches_eager(double dropout) {
  struct Case {
    const char* model;
    int64_t kv_heads;
  };
  for (const Case& m : {Case{"gpt", 0}, Case{"llama", 4}, Case{"llama", 2}}) {
    const TransformerShape shape = tiny(m.kv_heads);
    const LossAndGradients eager = run_model(m.model, shape, AttentionKind::Eager, 0, dropout);
    if (dropout > 0) { // dropping must move the loss by far more than the tolerance
      const LossAndGradients none = run_model(m.model, shape, AttentionKind::Eager, 0, 0);
      EXPECT_GT(std::abs(eager.loss - none.loss), 1e3 * kFusedTolerance) << m.model;
    }
    for (int64_t tile : {0, 3, 5}) {
      const LossAndGradients fused = run_model(m.model, shape, AttentionKind::Fused, tile, dropout);
      const std::string where = std::string(m.model) + " kv_heads " + std::to_string(m.kv_heads) +
                                " tile " + std::to_string(tile) +
                                (dropout > 0 ? " with dropout" : "");
      EXPECT_NEAR(fused.loss, eager.loss, kFusedTolerance) << where;
      ASSERT_EQ(fused.grads.size(), eager.grads.size()) << where;
      for (size_t i = 0; i < eager.grads.size(); ++i)
        EXPECT_LE(max_difference(fused.grads[i], eager.grads[i]), kFusedTolerance)
            << where << " gradient " << i;
    }
  }
}

TEST(FusedAttention, WholeGptAndLlamaMatchTheEagerCoreInFloat64) { expect_fused_matches_eager(0); }

// With dropout 0.1 on the probabilities and after attention and the MLP: the fused core drops
// the probabilities with the eager core's mask, tile by tile, and regenerates it in backward.
// Dropping moves the loss by far more than the tolerance, so a mask that differed in one
// element of a tile would show.
TEST(FusedAttention, WithDropoutTheFusedCoreDropsWhatTheEagerOneDrops) {
  expect_fused_matches_eager(0.1);
}

// Two blocks of keys with dropout, each through the fused kernel and through the plain-ops
// one (partial_attention.h, what context parallelism runs under --attention eager), merged by
// their log-sum-exp: the eager core's dropped attention of the same queries over all the keys,
// values and gradients. The merge is linear in each block's dropped output, so this is what a
// context-parallel rank computes.
TEST(FusedAttention, DroppedBlocksMergeIntoTheDroppedWhole) {
  torch::manual_seed(13);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto draw = std::make_shared<DropoutDraw>();
  draw->seed = 9;
  draw->step = 2;
  draw->samples = torch::tensor(std::vector<int64_t>{5, 2}, torch::kLong);
  AttentionDropout dropout;
  dropout.p = 0.25;
  dropout.layer = 1;
  dropout.first_head = 2;
  dropout.draw = draw;
  const torch::Tensor q = torch::randn({2, 3, 8, 4}, f64).requires_grad_(true);
  const torch::Tensor k = torch::randn({2, 3, 8, 4}, f64).requires_grad_(true);
  const torch::Tensor v = torch::randn({2, 3, 8, 4}, f64).requires_grad_(true);
  const torch::Tensor at = torch::arange(8, torch::kLong);
  const torch::Tensor g = torch::randn({2, 3, 4, 4}, f64);
  // The eager core over every key (under the draw, as a model runs it); queries 4..7.
  torch::Tensor whole;
  {
    const DropoutScope scope(draw);
    AttentionDropout current = dropout;
    current.draw = nullptr;
    whole = causal_attention(q, k, v, at, current).narrow(2, 4, 4);
  }
  const auto want = torch::autograd::grad({whole}, {q, k, v}, {g});
  const torch::Tensor qp = at.narrow(0, 4, 4), q_rows = q.narrow(2, 4, 4);
  for (bool fused : {true, false}) {
    auto block = [&](int64_t k0) {
      if (fused)
        return fused_attention(q_rows, k.narrow(2, k0, 4), v.narrow(2, k0, 4), qp,
                               at.narrow(0, k0, 4), 3, dropout);
      const BlockAttention r = partial_attention_reference(
          q_rows, k.narrow(2, k0, 4), v.narrow(2, k0, 4), qp, at.narrow(0, k0, 4), 0, dropout);
      return PartialAttention{r.out, r.lse};
    };
    const PartialAttention a = block(0), b = block(4);
    const torch::Tensor lse = torch::logaddexp(a.lse, b.lse);
    const torch::Tensor merged = (a.lse - lse).exp().unsqueeze(-1) * a.out +
                                 (b.lse - lse).exp().unsqueeze(-1) * b.out;
    const char* kernel = fused ? "fused" : "plain-ops";
    EXPECT_LE(max_difference(merged, whole), kFusedTolerance) << kernel;
    const auto got = torch::autograd::grad({merged}, {q, k, v}, {g});
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LE(max_difference(got[i], want[i]), kFusedTolerance) << kernel << " input " << i;
  }
  // Without dropout the same blocks give another output: the mask mattered.
  const PartialAttention plain = fused_attention(q_rows, k, v, qp, at);
  EXPECT_GT(max_difference(plain.out, whole), 1e3 * kFusedTolerance);
}

// fused_attention at separate positions, against plain_attention: queries after their keys
// ({4..7} over {0..3}), non-contiguous chunks where some queries see no key ({0,1,6,7} over
// {2..5}), and two key blocks merged by log-sum-exp (as a context-parallel rank merges the
// blocks it receives), with random gradients for both out and lse.
TEST(FusedAttention, SeparatePositionsAndGradientsThroughLse) {
  torch::manual_seed(11);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const auto positions = [](std::vector<int64_t> p) {
    return torch::tensor(p, torch::kLong);
  };
  const auto leaf = [&](std::vector<int64_t> shape) {
    return torch::randn(shape, f64).requires_grad_(true);
  };
  struct Case {
    std::vector<int64_t> q_at, k_at;
  };
  for (const Case& c : {Case{{4, 5, 6, 7}, {0, 1, 2, 3}}, Case{{0, 1, 6, 7}, {2, 3, 4, 5}},
                        Case{{3, 9, 4, 12, 5}, {8, 2, 11, 3, 0, 6, 1}}}) {
    const torch::Tensor qp = positions(c.q_at), kp = positions(c.k_at);
    const int64_t tq = qp.size(0), tk = kp.size(0);
    const torch::Tensor q = leaf({2, 3, tq, 4}), k = leaf({2, 3, tk, 4}), v = leaf({2, 3, tk, 4});
    const torch::Tensor g_out = torch::randn({2, 3, tq, 4}, f64), g_lse = torch::randn({2, 3, tq}, f64);
    // The rows that see a key; the others: out 0, lse -inf, and no gradient from either.
    const torch::Tensor sees = (kp.unsqueeze(0) <= qp.unsqueeze(1)).any(1);
    const torch::Tensor rows = sees.nonzero().view(-1);
    const PartialAttention got = fused_attention(q, k, v, qp, kp, /*tile_rows=*/2);
    const auto grads = torch::autograd::grad({got.out, got.lse}, {q, k, v}, {g_out, g_lse});
    const PartialAttention want =
        plain_attention(q.index_select(2, rows), k, v, qp.index_select(0, rows), kp);
    const auto want_grads = torch::autograd::grad(
        {want.out, want.lse}, {q, k, v}, {g_out.index_select(2, rows), g_lse.index_select(2, rows)});
    EXPECT_LE(max_difference(got.out.index_select(2, rows), want.out), kFusedTolerance);
    EXPECT_LE(max_difference(got.lse.index_select(2, rows), want.lse), kFusedTolerance);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LE(max_difference(grads[i], want_grads[i]), kFusedTolerance) << "input " << i;
    const torch::Tensor blind = (~sees).nonzero().view(-1);
    if (blind.numel() > 0) {
      EXPECT_TRUE(torch::equal(got.out.index_select(2, blind),
                               torch::zeros({2, 3, blind.size(0), 4}, f64)));
      EXPECT_TRUE(got.lse.index_select(2, blind).isneginf().all().item<bool>());
      EXPECT_EQ(grads[0].index_select(2, blind).abs().max().item<double>(), 0.0);
    }
  }
  // Queries {4..7} over keys {0..7} in two blocks, merged: out = Σ exp(lse_i - lse) out_i,
  // lse = logaddexp(lse_1, lse_2); its gradients reach q, k, v through both blocks' lse.
  const torch::Tensor qp = torch::arange(4, 8, torch::kLong), kp = torch::arange(8, torch::kLong);
  const torch::Tensor q = leaf({1, 2, 4, 4}), k = leaf({1, 2, 8, 4}), v = leaf({1, 2, 8, 4});
  const PartialAttention a = fused_attention(q, k.narrow(2, 0, 4), v.narrow(2, 0, 4), qp,
                                             kp.narrow(0, 0, 4), 3);
  const PartialAttention b = fused_attention(q, k.narrow(2, 4, 4), v.narrow(2, 4, 4), qp,
                                             kp.narrow(0, 4, 4), 3);
  const torch::Tensor lse = torch::logaddexp(a.lse, b.lse);
  const torch::Tensor merged = (a.lse - lse).exp().unsqueeze(-1) * a.out +
                               (b.lse - lse).exp().unsqueeze(-1) * b.out;
  const PartialAttention whole = plain_attention(q, k, v, qp, kp);
  EXPECT_LE(max_difference(merged, whole.out), kFusedTolerance);
  EXPECT_LE(max_difference(lse, whole.lse), kFusedTolerance);
  const torch::Tensor g = torch::randn({1, 2, 4, 4}, f64);
  const auto got = torch::autograd::grad({merged}, {q, k, v}, {g});
  const auto want = torch::autograd::grad({whole.out}, {q, k, v}, {g});
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE(max_difference(got[i], want[i]), kFusedTolerance) << "merged input " << i;
}

// 16-bit inputs: the output in the input's dtype, the log-sum-exp in float32 (as
// FlashAttention keeps it), gradients in the inputs' dtypes; and the core's output is a
// transposed view of [B, T, heads, d], so the output projection's layout is no copy.
TEST(FusedAttention, SixteenBitInputsKeepAFloat32LogSumExp) {
  torch::manual_seed(12);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const torch::Tensor q = torch::randn({1, 2, 6, 4}, bf16).requires_grad_(true);
  const torch::Tensor k = torch::randn({1, 2, 6, 4}, bf16).requires_grad_(true);
  const torch::Tensor v = torch::randn({1, 2, 6, 4}, bf16).requires_grad_(true);
  const torch::Tensor at = torch::arange(6, torch::kLong);
  const PartialAttention r = fused_attention(q, k, v, at, at, 4);
  EXPECT_EQ(r.out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(r.lse.scalar_type(), torch::kFloat);
  EXPECT_TRUE(r.out.transpose(1, 2).is_contiguous());
  r.out.sum().backward();
  for (const torch::Tensor& t : {q, k, v}) {
    EXPECT_EQ(t.grad().scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(t.grad().isfinite().all().item<bool>());
  }
  EXPECT_THROW(fused_attention(q, k, v, at.narrow(0, 0, 5), at), std::invalid_argument);
}

} // namespace fused_test
