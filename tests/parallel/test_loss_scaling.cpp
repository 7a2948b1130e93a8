// fp16 dynamic loss scaling (optim/optimizer.h LossScaler) and the mixed-precision optimizer:
// an overflow on any rank skips the step on every rank and halves the scale; good steps
// unscale exactly and grow the scale after 1000 of them; fp32 master weights, moments and
// the scale survive a checkpoint. LibTorch 1.13 has no fp16 matmul on the CPU, so the fp16
// model here is an embedding (its forward and backward have fp16 CPU kernels) trained with
// ZeRO stage 2 over two ranks (and stage 1 reducing in fp32): the strategies' own path
// (parallel/replica.h gradients_finite, ZeroDataParallel::step), on a model the CPU can run
// in fp16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>

#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "parallel/replica.h"
#include "parallel/strategy.h"
#include "parallel/data/zero.h"

using namespace meshsim;

namespace {

OptimizerOptions plain_sgd(double lr) {
  OptimizerOptions o;
  o.name = "sgd";
  o.lr = lr;
  o.momentum = 0;
  return o;
}

} // namespace

TEST(LossScaler, HalvesOnOverflowDoublesAfterAThousandGoodSteps) {
  LossScaler s;
  EXPECT_EQ(s.scale, 65536.0); // 2^16
  s.update(false);
  EXPECT_EQ(s.scale, 32768.0);
  for (int i = 0; i < LossScaler::kGrowthInterval - 1; ++i)
    s.update(true);
  EXPECT_EQ(s.scale, 32768.0); // 999 good steps: not yet
  s.update(true);
  EXPECT_EQ(s.scale, 65536.0);
  EXPECT_EQ(s.good_steps, 0);
  s.update(true);
  s.update(false); // an overflow restarts the count
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.good_steps, 0);
  for (int i = 0; i < 40; ++i)
    s.update(false);
  EXPECT_EQ(s.scale, LossScaler::kMinScale); // never below 1
}

// One fp16 parameter, plain SGD: a good step subtracts lr × (gradient / scale) from the fp32
// master, computed exactly here (every value is a small power-of-two multiple), and rounds
// the master into the parameter; an inf gradient changes nothing but the scale.
TEST(LossScaler, OptimizerUnscalesSkipsAndKeepsFp32Masters) {
  torch::Tensor p = torch::full({4}, 1.0, torch::kHalf).requires_grad_(true);
  allocate_gradients({p});
  Optimizer opt({p}, plain_sgd(1.0 / 1024));
  ASSERT_TRUE(opt.mixed_precision());
  ASSERT_TRUE(opt.loss_scaling());
  EXPECT_EQ(opt.loss_scale(), 65536.0);
  EXPECT_EQ(opt.state_bytes(), 4 * 4); // the fp32 master; plain SGD has no moments

  // Gradient 1/4 of the loss, carried as 1/4 × 2^16 in fp16.
  p.mutable_grad().fill_(0.25 * 65536);
  ASSERT_TRUE(opt.grads_finite());
  EXPECT_TRUE(opt.step(true));
  // master = 1 - 2^-10 × 2^-2 = 1 - 2^-12: fp32 holds it, fp16 (11 bits) rounds it back to 1.
  EXPECT_TRUE(torch::equal(p, torch::full({4}, 1.0, torch::kHalf)));
  p.mutable_grad().fill_(0.25 * 65536);
  for (int i = 0; i < 3; ++i)
    opt.step(true); // four steps in all: master 1 - 2^-10, which fp16 holds
  EXPECT_TRUE(torch::equal(p, torch::full({4}, 1.0 - 1.0 / 1024, torch::kHalf)));
  EXPECT_EQ(opt.step_count(), 4);

  p.mutable_grad()[2].fill_(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(opt.grads_finite());
  const torch::Tensor before = p.detach().clone();
  EXPECT_FALSE(opt.step(false));
  EXPECT_TRUE(torch::equal(p, before));
  EXPECT_EQ(opt.step_count(), 4);
  EXPECT_EQ(opt.loss_scale(), 32768.0);

  // Master weights, moments and the scale are part of the checkpoint.
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive out;
    opt.save(out);
    out.save_to(buffer);
  }
  torch::Tensor q = torch::full({4}, 1.0, torch::kHalf).requires_grad_(true);
  allocate_gradients({q});
  Optimizer loaded({q}, plain_sgd(1.0 / 1024));
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  loaded.load(in);
  EXPECT_EQ(loaded.loss_scale(), 32768.0);
  EXPECT_EQ(loaded.step_count(), 4);
  q.mutable_grad().fill_(0.25 * 32768); // 1/4 at the halved scale: master 1 - 2^-10 - 2^-12
  p.mutable_grad().fill_(0.25 * 32768);
  loaded.step(true);
  opt.step(true);
  EXPECT_TRUE(torch::equal(q, p)) << "the loaded master must continue where the saved one was";

  // An fp32 optimizer refuses the fp16 state (and the other way round), in one line.
  torch::Tensor f = torch::ones({4}).requires_grad_(true);
  allocate_gradients({f});
  Optimizer fp32({f}, plain_sgd(1.0 / 1024));
  buffer.seekg(0);
  torch::serialize::InputArchive again;
  again.load_from(buffer);
  try {
    fp32.load(again);
    ADD_FAILURE() << "an fp32 optimizer loaded fp16 state";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("another --precision"), std::string::npos) << e.what();
  }
}

namespace {

constexpr int kVocab = 32, kClasses = 8, kBatchPerRank = 8, kRanks = 2;

/// An embedding as a classifier, in fp16: label = id mod 8.
torch::nn::Sequential fp16_classifier() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(1);
  torch::nn::Sequential m;
  m->push_back("emb", torch::nn::Embedding(kVocab, kClasses));
  m->to(torch::kHalf);
  return m;
}

struct Fp16Run {
  std::vector<double> losses;
  std::vector<bool> stepped;
  std::vector<std::vector<double>> rank_scales = std::vector<std::vector<double>>(kRanks);
  const std::vector<double>& scales() const { return rank_scales[0]; }
};

OptimizerOptions fp16_adam() {
  OptimizerOptions adam;
  adam.lr = 0.05;
  return adam;
}

/// ZeRO stage 2 over two ranks, Adam, fp16 with loss scaling; `inject` (rank, step) puts an inf
/// into that rank's shard gradient after the reduction; `zero_options` replaces the stage-2
/// options.
Fp16Run train_fp16(int steps, std::pair<int, int> inject = {-1, -1},
                   const ZeroOptions& zero_options = ZeroOptions{2, 1.0, fp16_adam()}) {
  DeviceMesh mesh([] {
    MeshOptions o;
    o.world_size = kRanks;
    o.capacity_bytes = int64_t{64} << 20;
    return o;
  }());
  Fp16Run out;
  std::mutex mutex;
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::nn::Sequential model;
    {
      CategoryScope scope(MemoryCategory::Parameters);
      model = fp16_classifier();
    }
    const Group world = Group::world(kRanks);
    ZeroDataParallel zero(ctx, model, world, zero_options);
    Optimizer& opt = *zero.optimizer();
    for (int k = 1; k <= steps; ++k) {
      // Each id at most once per global batch: a scaled logit gradient is at most
      // 2^16 / 16 = 4096 per sample, so one id's gradient row stays far below fp16's 65504
      // and only an injected inf can overflow.
      const torch::Tensor ids =
          (torch::arange(kBatchPerRank) + kBatchPerRank * ctx.rank + 5 * k).remainder(kVocab);
      const torch::Tensor labels = ids.remainder(kClasses);
      zero.zero_grad();
      const double scale = opt.loss_scale();
      torch::Tensor loss;
      {
        CategoryScope scope(MemoryCategory::Activations);
        loss = loss_fn(zero.module()->forward(ids), labels);
        (loss * scale).backward();
      }
      zero.finish_gradients(k);
      if (ctx.rank == inject.first && k == inject.second)
        opt.params().front().grad().view({-1})[0].fill_(std::numeric_limits<float>::infinity());
      const bool finite = gradients_finite(ctx, opt, world);
      const auto before = zero.full_parameters();
      zero.step(k, finite);
      const auto after = zero.full_parameters();
      bool changed = false;
      for (size_t i = 0; i < before.size(); ++i)
        changed = changed || !torch::equal(before[i], after[i]);
      torch::Tensor mean = torch::tensor({loss.item<double>() / kRanks}, torch::kFloat64);
      ctx.comm.all_reduce(mean, ReduceOp::Sum, world);
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_EQ(changed, finite) << "rank " << ctx.rank << " step " << k;
      out.rank_scales[ctx.rank].push_back(opt.loss_scale());
      if (ctx.rank == 0) {
        out.losses.push_back(mean.item<double>());
        out.stepped.push_back(finite);
      }
    }
  });
  EXPECT_EQ(out.rank_scales[0], out.rank_scales[1]) << "the ranks' scales diverged";
  return out;
}

} // namespace

TEST(LossScaling, Fp16ZeroRunLearnsWithoutSkipping) {
  const Fp16Run run = train_fp16(30);
  ASSERT_EQ(run.losses.size(), 30u);
  for (int k = 0; k < 30; ++k) {
    EXPECT_TRUE(run.stepped[k]) << "step " << k + 1;
    EXPECT_EQ(run.scales()[k], LossScaler::kInitialScale) << "step " << k + 1;
  }
  EXPECT_LT(run.losses.back(), run.losses.front());
  std::cout << "fp16 zero-2 run: loss " << run.losses.front() << " -> " << run.losses.back()
            << " at scale " << run.scales().back() << "\n";
}

TEST(LossScaling, InfOnOneRankSkipsTheStepEverywhereAndHalvesTheScale) {
  const Fp16Run clean = train_fp16(6);
  const Fp16Run run = train_fp16(6, {1, 3}); // rank 1's shard overflows at step 3
  for (int k = 0; k < 6; ++k)
    EXPECT_EQ(run.stepped[k], k != 2) << "step " << k + 1;
  EXPECT_EQ(run.scales()[1], 65536.0);
  EXPECT_EQ(run.scales()[2], 32768.0);
  EXPECT_EQ(run.scales()[5], 32768.0);
  // Steps 1-3 ran on the clean run's parameters (the inf came after step 3's backward);
  // step 4 runs on parameters that missed step 3's update, so its loss differs.
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(run.losses[k], clean.losses[k]) << "step " << k + 1;
  EXPECT_NE(run.losses[3], clean.losses[3]);
}

// --reduce-fp32 under ZeRO 1 in fp16 (Megatron's fp16 main_grad): the scaled fp16 gradients
// are added into the fp32 flat gradient, all-reduced in fp32, and unscaled from it. Each id
// is read by one sample of the global batch, so every element of the reduced gradient is one
// rank's fp16 value plus zeros, halved: exact in fp16 and in fp32 alike. The fp32 path must
// then reproduce the fp16 stage-2 run bit for bit, and skip an overflowed step the same way.
// Plain SGD, whose update is proportional to the gradient (Adam's would hide a gradient off
// by a constant factor).
TEST(LossScaling, Fp16ZeroOneReducedInFp32MatchesTheFp16ReductionExactly) {
  const ZeroOptions fp16_reduce{2, 1.0, plain_sgd(0.5)};
  ZeroOptions fp32_reduce{1, 1.0, plain_sgd(0.5)};
  fp32_reduce.reduce_fp32 = true;
  const Fp16Run reference = train_fp16(12, {-1, -1}, fp16_reduce);
  const Fp16Run run = train_fp16(12, {-1, -1}, fp32_reduce);
  ASSERT_EQ(run.losses.size(), reference.losses.size());
  for (size_t k = 0; k < run.losses.size(); ++k) {
    EXPECT_TRUE(run.stepped[k]) << "step " << k + 1;
    EXPECT_EQ(run.losses[k], reference.losses[k]) << "step " << k + 1;
  }
  EXPECT_LT(run.losses.back(), run.losses.front());

  const Fp16Run skipped = train_fp16(6, {1, 3}, fp32_reduce); // rank 1's fp32 gradient overflows
  for (int k = 0; k < 6; ++k)
    EXPECT_EQ(skipped.stepped[k], k != 2) << "step " << k + 1;
  EXPECT_EQ(skipped.scales()[2], 32768.0);
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(skipped.losses[k], reference.losses[k]) << "step " << k + 1;
  EXPECT_NE(skipped.losses[3], reference.losses[3]);
  std::cout << "fp16 zero-1 reduced in fp32: loss " << run.losses.front() << " -> "
            << run.losses.back() << ", as the fp16 reduction's\n";
}
