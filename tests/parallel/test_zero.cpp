// ZeRO stages 0-3 (parallel/data/zero.h) against single-device training of the same global
// batch, in float64 (losses and final parameters within 1e-9 relative: the derivation is in
// tests/parallel/strategy_harness.h), and the exact model-state
// bytes every GPU holds between steps: with Adam and Ψ parameters, stage 0 16Ψ, stage 1
// 8Ψ + 8Ψ/dp, stage 2 4Ψ + 12Ψ/dp, stage 3 16Ψ/dp, with the transient bounds of docs/zero.md.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "data/dataset.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/models.h"
#include "parallel/strategy.h"
#include "parallel/data/zero.h"
#include "strategy_harness.h"

using namespace meshsim;

namespace {

constexpr double kTolerance = 1e-9;  // kFloat64Tolerance of strategy_harness.h
constexpr int64_t kGlobalBatch = 32;

struct RunResult {
  std::vector<double> losses;            // per step, the mean over the whole global batch
  std::vector<torch::Tensor> parameters; // final, full
  torch::Tensor evaluated;               // the final model's output on the first 8 samples
  std::vector<CollectiveRecord> records; // rank 0's
};

OptimizerOptions sgd() {
  OptimizerOptions o;
  o.name = "sgd";
  o.lr = 0.05;
  o.momentum = 0.9;
  return o;
}

OptimizerOptions adam() {
  return OptimizerOptions{};
} // adam, lr 1e-3

const Dataset& data() {
  static const Dataset d = [] {
    Dataset x = synthetic_dataset(512, 16, 11).train;
    x.images = x.images.to(torch::kFloat64);
    return x;
  }();
  return d;
}

/// Sample indices [first, first + count) of global batch k.
std::vector<int64_t> indices(int k, int64_t first, int64_t count) {
  const int64_t begin = (k * kGlobalBatch) % (data().size() - kGlobalBatch);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < count; ++i)
    idx.push_back(begin + first + i);
  return idx;
}

/// The reference: one device, the whole global batch, meshsim's own optimizer.
RunResult run_single(const OptimizerOptions& opt, int steps) {
  RunResult out;
  auto model = build_model("cnn", ModelOptions{3, 0, {}, torch::kFloat64});
  auto params = model->parameters();
  allocate_gradients(params);
  Optimizer optimizer(params, opt);
  for (int k = 0; k < steps; ++k) {
    optimizer.zero_grad();
    auto [x, y] = gather_batch(data(), indices(k, 0, kGlobalBatch));
    torch::Tensor loss = loss_fn(model->forward(x), y);
    loss.backward();
    optimizer.step();
    out.losses.push_back(loss.item<double>());
  }
  for (const auto& p : params)
    out.parameters.push_back(p.detach().clone());
  torch::NoGradGuard no_grad;
  out.evaluated = model->forward(gather_batch(data(), indices(0, 0, 8)).first);
  return out;
}

/// dp members each take their contiguous 1/dp of the global batch, in `micro` micro-batches
/// (one backward each, the loss scaled by 1/micro as gradient accumulation does).
// The calls of `op` over the 2 members among `records`: started with *_async (waited for
// later) or blocking.
int64_t count(const std::vector<CollectiveRecord>& records, const std::string& op, bool async) {
  int64_t n = 0;
  for (const auto& r : records)
    n += r.op == op && (r.waited_s >= 0) == async && r.group.size() == 2 ? 1 : 0;
  return n;
}

RunResult run_zero(int stage, int dp, const OptimizerOptions& opt, int steps, int micro = 1,
                   bool distributed_optimizer = false) {
  RunResult out;
  DeviceMesh mesh(meshsim::testing::mesh_options(dp, int64_t{1} << 30));
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::nn::Sequential model;
    {
      // Different initial weights on every member: the broadcast from dp.ranks[0] must
      // make them equal to the reference's (seed 3).
      CategoryScope scope(MemoryCategory::Parameters);
      model = build_model("cnn", ModelOptions{3 + 100 * static_cast<uint64_t>(ctx.rank), ctx.rank,
                                              {}, torch::kFloat64});
    }
    const Group group = Group::world(dp);
    ZeroOptions options{stage, /*bucket_mb=*/0.5, opt};
    options.distributed_optimizer = distributed_optimizer;
    ZeroDataParallel zero(ctx, model, group, options);
    const int64_t local = kGlobalBatch / dp;
    const int64_t per_micro = local / micro;
    for (int k = 0; k < steps; ++k) {
      zero.zero_grad();
      double local_loss = 0;
      for (int m = 0; m < micro; ++m) {
        CategoryScope scope(MemoryCategory::Activations);
        auto [x, y] = gather_batch(data(), indices(k, ctx.rank * local + m * per_micro, per_micro));
        torch::Tensor loss = loss_fn(zero.module()->forward(x), y) / micro;
        loss.backward();
        local_loss += loss.item<double>();
      }
      zero.finish_gradients(k + 1);
      zero.step(k + 1);
      CategoryScope scope(MemoryCategory::Communication);
      torch::Tensor mean = torch::tensor({local_loss}, torch::kFloat64);
      ctx.comm.all_reduce(mean, ReduceOp::Avg, group);
      if (ctx.rank == 0)
        out.losses.push_back(mean.item<double>());
    }
    // The forward of the trained model: the distributed optimizer's gathers the last step's
    // update here, before any full_parameters().
    torch::Tensor evaluated;
    {
      CategoryScope scope(MemoryCategory::Activations);
      torch::NoGradGuard no_grad;
      evaluated = zero.module()->forward(gather_batch(data(), indices(0, 0, 8)).first);
    }
    GpuGuard host(nullptr);
    auto full = zero.full_parameters();
    if (ctx.rank == 0) {
      out.parameters = full;
      out.evaluated = evaluated.clone();
      out.records = ctx.comm.records();
    }
  });
  return out;
}

double zero_relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const double denom = b.norm().item<double>();
  return (a - b).norm().item<double>() / (denom > 0 ? denom : 1.0);
}

void expect_matches_single(int stage, int dp, const OptimizerOptions& opt, int micro = 1,
                           bool distributed_optimizer = false) {
  constexpr int kSteps = 10;
  // The reference depends on the optimizer alone (sgd() or adam()): trained once per process.
  static std::map<std::string, RunResult> references;
  if (!references.count(opt.name))
    references.emplace(opt.name, run_single(opt, kSteps));
  const RunResult& ref = references.at(opt.name);
  const auto got = run_zero(stage, dp, opt, kSteps, micro, distributed_optimizer);
  EXPECT_LT(zero_relative_error(got.evaluated, ref.evaluated), kTolerance) << "stage " << stage;
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (int k = 0; k < kSteps; ++k)
    EXPECT_NEAR(got.losses[k], ref.losses[k], kTolerance * std::abs(ref.losses[k]))
        << "stage " << stage << " step " << k + 1;
  EXPECT_LT(ref.losses.back(), ref.losses.front()); // it did learn something
  ASSERT_EQ(got.parameters.size(), ref.parameters.size());
  double worst = 0;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    ASSERT_EQ(got.parameters[i].sizes(), ref.parameters[i].sizes()) << "parameter " << i;
    const double e = zero_relative_error(got.parameters[i], ref.parameters[i]);
    worst = std::max(worst, e);
    EXPECT_LT(e, kTolerance) << "stage " << stage << " parameter " << i;
  }
  std::cout << fmt::format("zero stage {} dp {} {} micro {}: final loss {:.6f} (single {:.6f}), "
                           "worst parameter relative error {:.2e}\n",
                           stage, dp, opt.name, micro, got.losses.back(), ref.losses.back(), worst);
}

} // namespace

TEST(Zero, Stage0MatchesSingleDp4) {
  expect_matches_single(0, 4, sgd());
}
TEST(Zero, Stage1MatchesSingleDp4) {
  expect_matches_single(1, 4, sgd());
}
TEST(Zero, Stage2MatchesSingleDp4) {
  expect_matches_single(2, 4, sgd());
}
TEST(Zero, Stage3MatchesSingleDp4) {
  expect_matches_single(3, 4, sgd());
}
TEST(Zero, Stage2MatchesSingleDp2) {
  expect_matches_single(2, 2, sgd());
}
TEST(Zero, Stage3AdamMatchesSingleDp4) {
  expect_matches_single(3, 4, adam());
}

TEST(Zero, TwoMicroBatchesMatchSingleEveryStage) {
  for (int stage = 0; stage <= 3; ++stage)
    expect_matches_single(stage, 2, sgd(), /*micro=*/2);
}

// Megatron's distributed optimizer: stage 1's state, the gradients reduce-scattered and the
// updated parameters gathered by the next forward. The same training as single-device, and
// bit for bit stage 1's (a reduce-scatter adds each element over the members as the
// all-reduce does); the model's own forward after the last step sees the update.
TEST(Zero, DistributedOptimizerMatchesSingle) {
  expect_matches_single(1, 4, sgd(), 1, /*distributed_optimizer=*/true);
  expect_matches_single(1, 4, adam(), 1, true);
  expect_matches_single(1, 2, sgd(), /*micro=*/2, true);
}

TEST(Zero, DistributedOptimizerEqualsStage1BitForBit) {
  const RunResult stage1 = run_zero(1, 4, adam(), 4);
  const RunResult distributed = run_zero(1, 4, adam(), 4, 1, true);
  ASSERT_EQ(stage1.parameters.size(), distributed.parameters.size());
  for (size_t i = 0; i < stage1.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(stage1.parameters[i], distributed.parameters[i])) << "parameter " << i;
  EXPECT_TRUE(torch::equal(stage1.evaluated, distributed.evaluated));
}

// What each step sends: per unit one reduce-scatter of its gradients and one all-gather of its
// parameters, started ahead of its wait (async) in the next forward; no all-reduce of
// gradients, and nothing gathered right after the optimizer.
TEST(Zero, DistributedOptimizerReduceScattersAndGathersInTheNextForward) {
  constexpr int kSteps = 3;
  const RunResult stage1 = run_zero(1, 2, sgd(), kSteps);
  const RunResult distributed = run_zero(1, 2, sgd(), kSteps, 1, true);
  // Stage 1's units: its gradient all-reduces per step (the loss's too: one a step).
  const int64_t units = count(stage1.records, "all_reduce", false) / kSteps - 1;
  ASSERT_GT(units, 1);
  EXPECT_EQ(count(distributed.records, "reduce_scatter", false), units * kSteps);
  EXPECT_EQ(count(distributed.records, "all_reduce", false), kSteps); // the losses
  // Every step's forward gathers every unit, and the evaluation after the last step once more.
  EXPECT_EQ(count(distributed.records, "all_gather", true), units * (kSteps + 1));
  EXPECT_EQ(count(distributed.records, "all_gather", false), 0);
  EXPECT_EQ(count(stage1.records, "all_gather", false), units * kSteps);
}

// FSDP's prefetch: stage 3 gathers every unit with all_gather_async (the next block's started
// before the block computes, its wait where that block begins) and reduce-scatters beside
// backward, one in flight, as stage 2 does; nothing blocks. Stage 2 equals it bit for bit.
TEST(Zero, Stage3GathersAheadAndReduceScattersBesideBackward) {
  constexpr int kSteps = 3;
  const RunResult stage2 = run_zero(2, 2, adam(), kSteps);
  const RunResult stage3 = run_zero(3, 2, adam(), kSteps);
  // Stage 3's units are its blocks' (stage 2 buckets them): one reduce-scatter each a step.
  const int64_t units = count(stage3.records, "reduce_scatter", true) / kSteps;
  ASSERT_GT(units, 1);
  EXPECT_EQ(count(stage3.records, "reduce_scatter", true), units * kSteps);
  EXPECT_EQ(count(stage3.records, "reduce_scatter", false), 0);
  EXPECT_EQ(count(stage2.records, "reduce_scatter", false), 0);
  // Each unit in every forward and every backward, and in the evaluation after the last step;
  // blocking only where the test reads the full parameters at the end (full_parameters).
  EXPECT_EQ(count(stage3.records, "all_gather", true), units * (2 * kSteps + 1));
  EXPECT_EQ(count(stage3.records, "all_gather", false), units);
  ASSERT_EQ(stage2.parameters.size(), stage3.parameters.size());
  for (size_t i = 0; i < stage2.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(stage2.parameters[i], stage3.parameters[i])) << i;
}

TEST(Zero, RejectsBadStageAndForeignRank) {
  DeviceMesh mesh(meshsim::testing::mesh_options(1, int64_t{1} << 30));
  run_ranks(mesh, [&](RankContext& ctx) {
    CategoryScope scope(MemoryCategory::Parameters);
    auto model = build_model("cnn", {});
    EXPECT_THROW(ZeroDataParallel(ctx, model, Group::world(1), ZeroOptions{4, 25, {}}),
                 std::invalid_argument);
    EXPECT_THROW(ZeroDataParallel(ctx, model, Group{{1}}, ZeroOptions{1, 25, {}}), std::invalid_argument);
    ZeroOptions distributed{2, 25, {}};
    distributed.distributed_optimizer = true; // stage 1 only
    EXPECT_THROW(ZeroDataParallel(ctx, model, Group::world(1), distributed), std::invalid_argument);
  });
}
