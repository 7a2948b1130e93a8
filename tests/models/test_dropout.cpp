// Counter-based dropout (models/layers/dropout.h): the tensor hash is the scalar one bit for
// bit, any tile of a mask is the whole mask's tile (what a fused core and every layout rely
// on), the kept fraction is 1 - p within its binomial bound, masks of different layers are
// independent, the applied dropout scales what it keeps, models drop only in training, and
// --dropout is checked, saved in config.json and part of the fingerprint.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "config/config.h"
#include "models/gpt.h"
#include "models/layers/dropout.h"
#include "models/llama.h"

using namespace meshsim;

namespace {

DropoutDraw dropout_test_draw(int64_t step = 3) {
  DropoutDraw d;
  d.seed = 7;
  d.step = step;
  return d;
}

torch::Tensor dropout_range(int64_t begin, int64_t end) {
  return torch::arange(begin, end, torch::kLong);
}

// The binomial bound: n elements each kept with probability q independently (what a good
// hash gives) keep a fraction within 6 standard deviations, sqrt(q(1 - q) / n), of q but for
// a probability below 2e-9 (normal tail; n is in the tens of thousands here).
void expect_fraction_near(double fraction, double q, int64_t n, const std::string& what) {
  const double bound = 6 * std::sqrt(q * (1 - q) / static_cast<double>(n));
  EXPECT_LT(std::abs(fraction - q), bound) << what << ": " << fraction << " vs " << q;
  std::cout << what << ": " << fraction << " (expected " << q << " ± " << bound << ")\n";
}

} // namespace

TEST(DropoutMask, TensorHashIsTheScalarHash) {
  const DropoutDraw draw = dropout_test_draw();
  const double p = 0.1;
  const torch::Tensor keep =
      attention_dropout_keep(draw, p, /*layer=*/2, dropout_range(0, 3), /*first_head=*/1, 2,
                             dropout_range(0, 5), dropout_range(4, 8));
  ASSERT_EQ(keep.sizes(), (std::vector<int64_t>{3, 2, 5, 4}));
  const auto threshold = static_cast<uint64_t>(std::llround((1 - p) * 9007199254740992.0));
  int64_t kept = 0;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 4; ++j) {
          const uint64_t hash =
              dropout_hash(draw, 2, DropoutSite::AttentionProbabilities, {b, 1 + h, i, 4 + j});
          const bool want = (hash >> 11) < threshold;
          ASSERT_EQ(keep[b][h][i][j].item<bool>(), want) << b << " " << h << " " << i << " " << j;
          kept += want;
        }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 120);
}

TEST(DropoutMask, AnyTileIsTheWholeMasksTile) {
  const DropoutDraw draw = dropout_test_draw();
  const double p = 0.3;
  const torch::Tensor whole = attention_dropout_keep(draw, p, 1, dropout_range(0, 4), 0, 4,
                                                     dropout_range(0, 16), dropout_range(0, 16));
  // Rows 5..9 against keys 3..11, of samples 2, 3 and heads 2, 3 (a tensor-parallel member).
  const torch::Tensor tile = attention_dropout_keep(draw, p, 1, dropout_range(2, 4), 2, 2,
                                                    dropout_range(5, 10), dropout_range(3, 12));
  EXPECT_TRUE(torch::equal(tile, whole.slice(0, 2, 4).slice(1, 2, 4).slice(2, 5, 10).slice(3, 3, 12)));
  // Non-contiguous chunks of the sequence at their true positions (context parallelism), and
  // samples in another order (a data-parallel shard dealt round-robin).
  const torch::Tensor chunks = torch::tensor({0, 1, 14, 15}, torch::kLong);
  const torch::Tensor samples = torch::tensor({3, 1}, torch::kLong);
  const torch::Tensor got =
      attention_dropout_keep(draw, p, 1, samples, 0, 4, chunks, dropout_range(0, 16));
  EXPECT_TRUE(torch::equal(got, whole.index_select(0, samples).index_select(2, chunks)));
  // And the hidden dropout's mask is a function of the coordinates alone the same way.
  const torch::Tensor hidden = dropout_keep_mask(draw, p, 1, DropoutSite::MlpOutput,
                                                 {dropout_range(0, 4), dropout_range(0, 16),
                                                  dropout_range(0, 8)});
  const torch::Tensor part = dropout_keep_mask(draw, p, 1, DropoutSite::MlpOutput,
                                               {samples, dropout_range(8, 16), dropout_range(0, 8)});
  EXPECT_TRUE(torch::equal(part, hidden.index_select(0, samples).slice(1, 8, 16)));
}

TEST(DropoutMask, KeptFractionIsWithinItsBinomialBound) {
  for (double p : {0.1, 0.5}) {
    const DropoutDraw draw = dropout_test_draw();
    const auto mask = [&](const DropoutDraw& d, int64_t layer) {
      return attention_dropout_keep(d, p, layer, dropout_range(0, 4), 0, 8, dropout_range(0, 64),
                                    dropout_range(0, 64));
    };
    const torch::Tensor a = mask(draw, 0);
    const int64_t n = a.numel(); // 131,072
    const std::string tag = "p " + std::to_string(p);
    expect_fraction_near(a.to(torch::kDouble).mean().item<double>(), 1 - p, n, tag + " kept");
    // Independent masks agree where both keep or both drop: (1 - p)² + p².
    const double agree = (1 - p) * (1 - p) + p * p;
    expect_fraction_near(a.eq(mask(draw, 1)).to(torch::kDouble).mean().item<double>(), agree, n,
                         tag + " layer 0 vs 1 agree");
    expect_fraction_near(a.eq(mask(dropout_test_draw(4), 0)).to(torch::kDouble).mean().item<double>(),
                         agree, n, tag + " step 3 vs 4 agree");
    const int64_t half = n / 2;
    expect_fraction_near(a.slice(0, 0, 2).eq(a.slice(0, 2, 4)).to(torch::kDouble).mean().item<double>(),
                         agree, half, tag + " samples 0-1 vs 2-3 agree");
  }
}

TEST(DropoutMask, AppliedDropoutScalesWhatItKeeps) {
  const double p = 0.25;
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({2, 3, 4}, torch::kDouble).requires_grad_(true);
  const torch::Tensor keep = torch::rand({2, 3, 4}, torch::kDouble).gt(p);
  const torch::Tensor y = apply_dropout_mask(x, keep, p);
  EXPECT_TRUE(torch::allclose(y, x.detach() * keep / (1 - p), 0, 1e-15));
  y.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), keep.to(torch::kDouble) / (1 - p), 0, 1e-15));
  EXPECT_THROW(apply_dropout_mask(x, keep, 1.0), std::invalid_argument);
}

TEST(DropoutModel, OnlyTrainingDrops) {
  TransformerShape shape;
  shape.layers = 2;
  shape.hidden = 16;
  shape.heads = 2;
  shape.seq_len = 8;
  shape.vocab = 32;
  shape.ffn_hidden = 32;
  TransformerShape dropping = shape;
  dropping.dropout = 0.2;
  torch::manual_seed(3);
  const torch::Tensor tokens = torch::randint(0, 32, {3, 8}, torch::kLong);
  for (const bool llama : {false, true}) {
    const auto build = [&](const TransformerShape& s) {
      return llama ? build_llama(s, 5, torch::kDouble) : build_gpt(s, 5, torch::kDouble);
    };
    auto plain = build(shape), model = build(dropping);
    torch::NoGradGuard no_grad;
    const torch::Tensor want = plain->forward(tokens);
    model->eval();
    EXPECT_TRUE(torch::equal(model->forward(tokens), want)) << "evaluation drops nothing";
    model->train();
    EXPECT_THROW(model->forward(tokens), std::logic_error) << "training without a draw";
    auto draw = std::make_shared<DropoutDraw>(dropout_test_draw());
    draw->samples = dropout_range(0, 3);
    const DropoutScope scope(draw);
    const torch::Tensor dropped = model->forward(tokens);
    EXPECT_GT((dropped - want).abs().max().item<double>(), 1e-3) << "training drops";
    EXPECT_TRUE(torch::equal(model->forward(tokens), dropped)) << "the same draw, the same masks";
  }
}

TEST(DropoutConfig, CheckedSavedAndFingerprinted) {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.gpus = 1;
  c.dropout = 0.25;
  c.attention = "eager";
  validate(c);
  const TrainConfig back = config_from_json(to_json(c));
  EXPECT_EQ(back.dropout, 0.25);
  TrainConfig none = c;
  none.dropout = 0;
  EXPECT_NE(configuration_fingerprint(c), configuration_fingerprint(none));
  for (double bad : {-0.1, 1.0, std::nan("")}) {
    TrainConfig b = c;
    b.dropout = bad;
    EXPECT_THROW(validate(b), std::invalid_argument) << bad;
  }
  TrainConfig dp = c;
  dp.strategy = "dp";
  EXPECT_THROW(validate(dp), std::invalid_argument) << "dp's scatter does not give row indices";
  // Every attention core draws the same masks: the fused one (the default) and the
  // context-parallel ones take --dropout too.
  TrainConfig fused = c;
  fused.attention = "fused";
  EXPECT_NO_THROW(validate(fused));
  TrainConfig cp = fused;
  cp.gpus = 2;
  cp.cp = 2;
  EXPECT_NO_THROW(validate(cp));
  TrainConfig cnn;
  cnn.dropout = 0.1;
  EXPECT_THROW(validate(cnn), std::invalid_argument) << "the CNN has its own dropout";
}
