// Dropout on every layout draws the masks single-device training draws: data parallel 2
// (DDP, and the mesh engine with ZeRO-1), tensor parallel 2 with sequence parallelism, and a 1F1B pipeline of 2 stages with 2
// micro-batches (the last with full recompute, whose backward draws again), for the GPT and
// the Llama, in float64 against the single device with the same --dropout. The tolerance is
// kFloat64Tolerance (strategy_harness.h): dropout only multiplies by the same masks and the
// same scale on every layout, which adds no summation-order difference to the ones derived
// there. A layout whose masks differ moves the loss by percent (each mask drops a tenth of
// the activations), far outside it; the test also checks that dropout moved the loss.
#include <gtest/gtest.h>

#include <iostream>

#include "data/text.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kDropoutSteps = 4;
constexpr int64_t kDropoutGlobalBatch = 8;

const Dataset& dropout_text() {
  static const Dataset data = synthetic_text(256, 16, 16, 64, 3).train;
  return data;
}

StrategyOptions dropout_model(const std::string& model, double p) {
  StrategyOptions o = tiny_gpt_sgd(torch::kFloat64);
  o.model = model;
  o.shape.layers = 2;
  o.shape.hidden = 16;
  o.shape.heads = 4;
  if (model == "llama") o.shape.ffn_hidden = 32;
  o.shape.dropout = p;
  return o;
}

HarnessRun dropout_run(int world, const StrategyOptions& options) {
  static std::vector<std::unique_ptr<DeviceMesh>> meshes;  // outlive the returned runs
  meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(world, int64_t{1} << 30)));
  torch::manual_seed(5);  // the same permutation of the data for every run
  const bool single = world == 1 && options.micro_batches == 1 &&
                      options.recompute == Recompute::None;
  return run_strategy(*meshes.back(), single ? "single" : "ddp", options, dropout_text(),
                      kDropoutGlobalBatch, kDropoutSteps);
}

void expect_dropout_matches(const HarnessRun& ref, int world, const StrategyOptions& options,
                            const std::string& what) {
  const HarnessRun got = dropout_run(world, options);
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t k = 0; k < ref.losses.size(); ++k)
    EXPECT_NEAR(got.losses[k], ref.losses[k], kFloat64Tolerance * std::abs(ref.losses[k]))
        << what << " step " << k + 1;
  ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    const double e = relative_error(got.parameters[i], ref.parameters[i], 1e-5);
    EXPECT_LT(e, kFloat64Tolerance) << what << " parameter " << i;
    worst = std::max(worst, e);
  }
  std::cout << what << ": final loss " << got.losses.back() << " (single " << ref.losses.back()
            << "), worst parameter rel. error " << worst << "\n";
}

void expect_every_layout_matches(const std::string& model) {
  const HarnessRun none = dropout_run(1, dropout_model(model, 0));
  const StrategyOptions base = dropout_model(model, 0.1);
  const HarnessRun ref = dropout_run(1, base);
  // Dropout must have changed the run, or the comparisons below prove nothing.
  EXPECT_GT(std::abs(ref.losses.back() - none.losses.back()), 1e-4 * std::abs(none.losses.back()))
      << model << ": dropout 0.1 trains as dropout 0";
  StrategyOptions dp = base;
  expect_dropout_matches(ref, 2, dp, model + " dp2");  // DDP
  dp.zero = 1;
  expect_dropout_matches(ref, 2, dp, model + " dp2 zero1");  // the mesh engine
  StrategyOptions sp = base;
  sp.tp = 2;
  sp.sequence_parallel = true;
  expect_dropout_matches(ref, 2, sp, model + " tp2 sequence parallel");
  StrategyOptions pp = base;
  pp.pp = 2;
  pp.micro_batches = 2;
  expect_dropout_matches(ref, 2, pp, model + " pp2 1f1b 2 micro-batches");
  pp.recompute = Recompute::Full;
  expect_dropout_matches(ref, 2, pp, model + " pp2 1f1b full recompute");
  sp.recompute = Recompute::Selective;
  expect_dropout_matches(ref, 2, sp, model + " tp2 sequence parallel selective recompute");
}

} // namespace

TEST(DropoutEquivalence, GptOnEveryLayout) { expect_every_layout_matches("gpt"); }
TEST(DropoutEquivalence, LlamaOnEveryLayout) { expect_every_layout_matches("llama"); }
