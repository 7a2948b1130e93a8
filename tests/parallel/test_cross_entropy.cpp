// The vocab-parallel cross-entropy against the whole vocabulary's loss_fn, the mesh engine's
// use of it (a tensor-parallel step never gathers the logits), and the losses' counted work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "data/text.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "parallel/tensor/cross_entropy.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int64_t kVocab = 24;

DeviceMesh mesh_of(int world) {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = int64_t{1} << 30;
  return DeviceMesh(o);
}

// [2, 5] targets on every member's first and last column and between, for n up to 4.
torch::Tensor targets() {
  return torch::tensor({{0, 5, 6, 11, 12}, {17, 18, 23, 3, 20}}, torch::kLong);
}

struct Slices {
  std::vector<double> loss;
  std::vector<torch::Tensor> grad; // each member's [2, 5, V/n] gradient
};

// Every member's loss and gradient of its slice of `logits`.
Slices vocab_parallel(const torch::Tensor& logits, int n) {
  DeviceMesh mesh = mesh_of(n);
  Slices out{std::vector<double>(n), std::vector<torch::Tensor>(n)};
  const int64_t width = kVocab / n;
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::Tensor mine;
    {
      GpuGuard host(nullptr);
      mine = logits.narrow(-1, ctx.rank * width, width).clone().requires_grad_(true);
    }
    torch::Tensor loss =
        vocab_parallel_cross_entropy(mine, targets(), ctx.comm, Group::world(n), ctx.rank);
    loss.backward();
    GpuGuard host(nullptr);
    out.loss[ctx.rank] = loss.item<double>();
    out.grad[ctx.rank] = mine.grad().clone();
  });
  return out;
}

} // namespace

// Each member sums the exps of its V/n columns and the sums are added: V terms in another
// order than loss_fn's, so each sum's relative error is at most (V − 1)·u; the max, the shift,
// exp, log and the division add one rounding each. So the loss (|loss| ≤ log V + the logits'
// range, under 8 here) and every softmax entry (≤ 1) agree within (V + 8)·u·8.
TEST(VocabParallelCrossEntropy, EqualsTheWholeVocabularysLossAndGradientOnEverySlice) {
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({2, 5, kVocab}, torch::kFloat64) * 2;
  torch::Tensor whole = logits.clone().requires_grad_(true);
  torch::Tensor expected = loss_fn(whole, targets());
  expected.backward();
  const double u = std::numeric_limits<double>::epsilon() / 2;
  const double tolerance = (kVocab + 8) * u * 8;
  for (int n : {1, 2, 4}) {
    const Slices got = vocab_parallel(logits, n);
    const int64_t width = kVocab / n;
    for (int r = 0; r < n; ++r) {
      EXPECT_NEAR(got.loss[r], expected.item<double>(), tolerance) << "n " << n << " rank " << r;
      const torch::Tensor slice = whole.grad().narrow(-1, r * width, width);
      EXPECT_LE((got.grad[r] - slice).abs().max().item<double>(), tolerance)
          << "n " << n << " rank " << r;
    }
  }
}

// bf16 logits are cast to fp32 as loss_fn casts them: the loss is fp32's (within the bound
// above in fp32's u), the gradient comes back in bf16, within one bf16 rounding (2^-8
// relative) of loss_fn's.
TEST(VocabParallelCrossEntropy, Bf16LogitsGiveAnFp32LossAndABf16Gradient) {
  torch::manual_seed(4);
  const torch::Tensor logits = (torch::randn({2, 5, kVocab}) * 2).to(torch::kBFloat16);
  torch::Tensor whole = logits.clone().requires_grad_(true);
  torch::Tensor expected = loss_fn(whole, targets());
  expected.backward();
  ASSERT_EQ(expected.scalar_type(), torch::kFloat32);
  const double u = std::numeric_limits<float>::epsilon() / 2;
  const double tolerance = (kVocab + 8) * u * 8;
  const Slices got = vocab_parallel(logits, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(got.loss[r], expected.item<double>(), tolerance) << "rank " << r;
    ASSERT_EQ(got.grad[r].scalar_type(), torch::kBFloat16);
    const torch::Tensor slice =
        whole.grad().narrow(-1, r * kVocab / 2, kVocab / 2).to(torch::kFloat64);
    const torch::Tensor mine = got.grad[r].to(torch::kFloat64);
    const torch::Tensor bound = slice.abs() * std::ldexp(1.0, -8) + tolerance;
    EXPECT_TRUE(((mine - slice).abs() <= bound).all().item<bool>()) << "rank " << r;
  }
}

// The counted kernels: the slice's elements pass through the max, shift, exp, sum and
// division forward (4 + 8 + 8 + 4 + 8 bytes each, fp32) after a cast of bf16 (2 + 4), and
// the product and the cast back in backward (8 + 6).
TEST(VocabParallelCrossEntropy, CountsItsKernelsOnTheSlice) {
  const double tokens = 10, width = 12, n = tokens * width;
  const LossWork bf16 = vocab_parallel_cross_entropy_work(tokens, width, 2);
  const LossWork fp32 = vocab_parallel_cross_entropy_work(tokens, width, 4);
  EXPECT_DOUBLE_EQ(bf16.forward.bytes - fp32.forward.bytes, 6 * n);
  EXPECT_DOUBLE_EQ(fp32.forward.bytes, 32 * n + 8 * tokens + 10 * 16 * tokens);
  EXPECT_DOUBLE_EQ(bf16.backward.bytes, 14 * n + 3 * 16 * tokens);
  EXPECT_EQ(fp32.forward.kernels, 5 + 10);
  EXPECT_EQ(bf16.backward.kernels, 2 + 3);
}

// A tp 2 step of the GPT (untied head, split over the vocabulary): the logits stay split, so
// no all-gather carries them, and the loss's three all-reduces (the max, the target's logit,
// the sum of exps) carry one value a token each. Evaluation still sees them whole.
TEST(VocabParallelMesh, ATensorParallelStepNeverGathersTheLogits) {
  const Dataset data = synthetic_text(64, 16, 16, 64, 3).train;
  StrategyOptions o = tiny_gpt_sgd(torch::kFloat64);
  o.tp = 2;
  DeviceMesh mesh = mesh_of(2);
  torch::manual_seed(5);
  std::vector<int64_t> widths(2);
  const auto after = [&](RankContext& ctx, Strategy& s, int) {
    torch::NoGradGuard no_grad;
    widths[ctx.rank] = s.eval_model()->forward(data.images.narrow(0, 0, 2)).size(-1);
  };
  // 5 sequences: 80 tokens, so no parameter shard that full_parameters() gathers at the end
  // has the logits' size (80·32 values), and no tensor but the loss's has 80 values.
  const HarnessRun run = run_strategy(mesh, "ddp", o, data, 5, 1, after);
  EXPECT_EQ(widths, (std::vector<int64_t>{64, 64})) << "after a step the logits are whole";
  const int64_t tokens = 5 * 16, logits_bytes = tokens * (64 / 2) * 8;
  int token_reduces = 0;
  for (const CollectiveRecord& c : run.recorders[0].collectives) {
    EXPECT_FALSE(c.op == "all_gather" && c.bytes == logits_bytes) << "the logits were gathered";
    if (c.op == "all_reduce" && c.bytes == tokens * 8) ++token_reduces;
  }
  EXPECT_EQ(token_reduces, 3);
}

// loss_fn's kernels on bf16 logits: the cast (2 + 4 bytes an element), log-softmax (4 + 4)
// forward; zeros (4), log-softmax's backward (4 + 4 + 4), the cast back (4 + 2) backward; and
// one kernel over the tokens each way.
TEST(TrainingLossWork, LossFnCountsItsPassesOverTheWholeLogits) {
  const double tokens = 10, classes = 64, n = tokens * classes;
  const LossWork w = loss_work(tokens, classes, 2);
  EXPECT_DOUBLE_EQ(w.forward.bytes, 14 * n + 16 * tokens);
  EXPECT_DOUBLE_EQ(w.backward.bytes, 22 * n + 16 * tokens);
  EXPECT_EQ(w.forward.kernels, 3);
  EXPECT_EQ(w.backward.kernels, 4);
}

// Each step's records carry the loss it ran: a single GPU's over the 64 classes, a tp 2
// member's over its 32 (float64 logits: no cast), first in backward.
TEST(TrainingLossWork, AStepRecordsTheLossOverTheLogitsItHolds) {
  const Dataset data = synthetic_text(64, 16, 16, 64, 3).train;
  const double tokens = 4 * 16;
  for (int tp : {1, 2}) {
    StrategyOptions o = tiny_gpt_sgd(torch::kFloat64);
    o.tp = tp;
    DeviceMesh mesh = mesh_of(tp);
    torch::manual_seed(5);
    const HarnessRun run = run_strategy(mesh, tp == 1 ? "single" : "ddp", o, data, 4, 1);
    const LossWork expected = tp == 1 ? loss_work(tokens, 64, 8)
                                      : vocab_parallel_cross_entropy_work(tokens, 32, 8);
    const std::vector<ComputeRecord>& compute = run.recorders[0].compute;
    const auto named = [&](const std::string& name) {
      return std::find_if(compute.begin(), compute.end(),
                          [&](const ComputeRecord& r) { return r.name == name; });
    };
    const auto forward = named("forward"), backward = named("backward");
    ASSERT_NE(forward, compute.end());
    ASSERT_NE(backward, compute.end());
    ASSERT_FALSE(forward->layers.empty());
    EXPECT_EQ(forward->layers.back().layer, "loss") << "tp " << tp;
    EXPECT_DOUBLE_EQ(forward->layers.back().bytes, expected.forward.bytes) << "tp " << tp;
    EXPECT_EQ(backward->layers.front().layer, "loss") << "tp " << tp;
    EXPECT_DOUBLE_EQ(backward->layers.front().bytes, expected.backward.bytes) << "tp " << tp;
  }
}

// The mesh engine lets go of the logits once the loss has them, as `single` does: what
// backward needs of them, the loss's graph keeps. On one GPU with ZeRO 1 (the mesh engine) a
// step's activation peak is single-device training's.
TEST(TrainingLossWork, TheMeshEngineHoldsNoMoreActivationsThanOneDevice) {
  const Dataset data = synthetic_text(64, 16, 16, 64, 3).train;
  std::vector<int64_t> peaks;
  for (int zero : {0, 1}) {
    StrategyOptions o = tiny_gpt_sgd(torch::kFloat64);
    o.zero = zero;
    DeviceMesh mesh = mesh_of(1);
    torch::manual_seed(5);
    run_strategy(mesh, zero == 0 ? "single" : "ddp", o, data, 4, 1);
    peaks.push_back(mesh.gpu(0).stats().peak_by_category[static_cast<size_t>(
        MemoryCategory::Activations)]);
  }
  EXPECT_EQ(peaks[1], peaks[0]);
}

// --no-loss-upcast: loss_fn's passes at the logits' own width, no casts: log-softmax (2 + 2
// bytes an element) forward; zeros (2) and log-softmax's backward (2 + 2 + 2) backward. On
// 4-byte logits there is nothing to cast either way.
TEST(TrainingLossWork, WithoutTheUpcastItsPassesAreAtTheLogitsWidth) {
  const double tokens = 10, classes = 64, n = tokens * classes;
  const LossWork w = loss_work(tokens, classes, 2, /*upcast=*/false);
  EXPECT_DOUBLE_EQ(w.forward.bytes, 4 * n + 16 * tokens);
  EXPECT_DOUBLE_EQ(w.backward.bytes, 8 * n + 16 * tokens);
  EXPECT_EQ(w.forward.kernels, 2);
  EXPECT_EQ(w.backward.kernels, 3);
  const LossWork fp32 = loss_work(tokens, classes, 4, false), upcast = loss_work(tokens, classes, 4);
  EXPECT_DOUBLE_EQ(fp32.forward.bytes, upcast.forward.bytes);
  EXPECT_DOUBLE_EQ(fp32.backward.bytes, upcast.backward.bytes);
}

// Without the upcast, bf16 logits give a bf16 loss: each token's −log p rounded to bf16 once
// (u = 2^-8 relative), their sum over N tokens (all terms ≥ 0) and its division by N rounding
// at most once a step: within (N + 1)·u of the exact loss, to first order. The gradient
// (p − y)/N is formed from the bf16 log-probabilities o: exp of o's rounding (|δo| ≤ |o|·u)
// moves p by p·|o|·u, and 1/N, the subtraction and the result are rounded once each (3u of
// |g|): within u·(p·L/N + 3|g|), L the largest |o|, against float64's.
TEST(TrainingLossWork, WithoutTheUpcastBf16LogitsGiveABf16LossAndGradient) {
  torch::manual_seed(4);
  const torch::Tensor logits = (torch::randn({2, 5, kVocab}) * 2).to(torch::kBFloat16);
  torch::Tensor native = logits.clone().requires_grad_(true);
  torch::Tensor loss = loss_fn(native, targets(), /*upcast=*/false);
  loss.backward();
  EXPECT_EQ(loss.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(native.grad().scalar_type(), torch::kBFloat16);
  torch::Tensor exact = logits.to(torch::kFloat64).requires_grad_(true);
  torch::Tensor reference = loss_fn(exact, targets());
  reference.backward();
  const double u = std::ldexp(1.0, -8), tokens = 10;
  EXPECT_NEAR(loss.item<double>(), reference.item<double>(),
              (tokens + 1) * u * reference.item<double>());
  const torch::Tensor o = torch::log_softmax(logits.to(torch::kFloat64), -1);
  const double largest = o.abs().max().item<double>();
  const torch::Tensor g = exact.grad();
  const torch::Tensor bound = u * (o.exp() * largest / tokens + 3 * g.abs());
  EXPECT_TRUE(((native.grad().to(torch::kFloat64) - g).abs() <= bound).all().item<bool>());
}

// What the loss holds (n = tokens × vocabulary, bf16 logits): with the upcast, at backward's
// start, the fp32 log-softmax kept from forward, the zeros of its gradient and the gradient
// it makes (4 + 4 + 4 bytes an element; forward's logits, their fp32 copy and the
// log-softmax, 2 + 4 + 4, are fewer); without, the same three in bf16 (2 + 2 + 2). The rest
// of the step is the same but for the loss itself and its gradient's seed (0-dim, fp32
// against bf16: 4 bytes), so the activations' peak falls by 6n + 4 bytes.
TEST(TrainingLossWork, WithoutTheUpcastTheActivationsPeakSixBytesAnElementLower) {
  const Dataset data = synthetic_text(64, 16, 16, 4096, 3).train;
  std::vector<int64_t> peaks;
  for (bool upcast : {true, false}) {
    StrategyOptions o = tiny_gpt_sgd(torch::kFloat32);
    o.shape.vocab = 4096;
    o.precision = "bf16";
    o.loss_upcast = upcast;
    DeviceMesh mesh = mesh_of(1);
    torch::manual_seed(5);
    run_strategy(mesh, "single", o, data, 4, 1);
    peaks.push_back(mesh.gpu(0).stats().peak_by_category[static_cast<size_t>(
        MemoryCategory::Activations)]);
  }
  const int64_t n = 4 * 16 * 4096;
  EXPECT_EQ(peaks[0] - peaks[1], 6 * n + 2 * (4 - 2)) << peaks[0] << " " << peaks[1];
}
