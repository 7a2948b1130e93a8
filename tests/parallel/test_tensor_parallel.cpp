// Tensor parallelism against exactly known values (the two mappings) and against the
// unsharded GPT (logits, gradients, 10 SGD steps) at tp = 2 and 4, with and without
// activation checkpointing; and the per-rank parameter count of a sharded block.
#include <gtest/gtest.h>

#include <iostream>

#include "data/text.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/gpt.h"
#include "parallel/strategy.h"
#include "parallel/tensor/tensor_parallel.h"
#include "strategy_harness.h"

using namespace meshsim;
namespace nn = torch::nn;

namespace {

constexpr uint64_t kTpSeed = 7;

TransformerShape small_tp_gpt() {
  TransformerShape o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.seq_len = 16;
  o.vocab = 64;
  return o;
}

OptimizerOptions tp_sgd() {
  OptimizerOptions o;
  o.name = "sgd";
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

DeviceMesh tp_mesh(int world) {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = int64_t{1} << 30;
  return DeviceMesh(o);
}

// Batch k: 4 consecutive sequences of the synthetic text.
Dataset batch(const Dataset& data, int k) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < 4; ++i)
    idx.push_back((4 * k + i) % data.size());
  auto [x, y] = gather_batch(data, idx);
  return Dataset{x, y};
}

std::vector<torch::Tensor> host_copies(const std::vector<torch::Tensor>& ts) {
  GpuGuard host(nullptr);
  std::vector<torch::Tensor> out;
  for (const auto& t : ts)
    out.push_back(t.detach().clone());
  return out;
}

// ||a - b|| / ||b||, with ||b|| floored at 1e-5: the key bias's gradient (and so the key bias
// itself, which starts at 0) is zero in exact arithmetic, because softmax ignores a shift
// shared by all keys; both models leave ~1e-11 of rounding there, which only an absolute
// comparison can judge.
double tp_relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return meshsim::testing::relative_error(a, b, 1e-5);
}

double max_relative_error(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].sizes(), b[i].sizes()) << "tensor " << i;
    if (a[i].sizes() == b[i].sizes())
      worst = std::max(worst, tp_relative_error(a[i], b[i]));
  }
  return worst;
}

// Builds the GPT on the calling rank (charged as parameters) and shards it over the world.
nn::Sequential sharded_gpt(RankContext& ctx, Recompute recompute,
                           torch::Dtype dtype = torch::kFloat32) {
  nn::Sequential model;
  CategoryScope params(MemoryCategory::Parameters);
  model = build_model("gpt", ModelOptions{kTpSeed, 0, small_tp_gpt(), dtype});
  parallelize_tensor(model, gpt_parallel_plan(small_tp_gpt()), ctx.comm, Group::world(ctx.world_size),
                     ctx.rank);
  set_recompute(model, recompute);
  return model;
}

struct TpReference {
  torch::Tensor logits;
  double loss = 0;
  std::vector<torch::Tensor> grads;
};

TpReference unsharded_step(const Dataset& b) {
  auto model = build_model("gpt", ModelOptions{kTpSeed, 0, small_tp_gpt()});
  TpReference r;
  r.logits = model->forward(b.images);
  torch::Tensor loss = loss_fn(r.logits, b.labels);
  loss.backward();
  r.loss = loss.item<double>();
  for (const auto& p : unique_parameters(*model))
    r.grads.push_back(p.grad());
  r.logits = r.logits.detach();
  return r;
}

} // namespace

TEST(TensorParallelMappings, ExactValuesForwardAndBackward) {
  for (int n : {2, 4}) {
    DeviceMesh mesh = tp_mesh(n);
    std::vector<torch::Tensor> copy_out(n), copy_grad(n), reduce_out(n), reduce_grad(n);
    run_ranks(mesh, [&](RankContext& ctx) {
      const Group all = Group::world(n);
      const double mine = ctx.rank + 1; // rank r holds r+1: the sum is n(n+1)/2 exactly
      torch::Tensor x = torch::full({2, 3}, mine).requires_grad_(true);
      torch::Tensor y = copy_to_region(x, ctx.comm, all);
      (y * mine).sum().backward(); // dL/dy = r+1 here; the sum over members arrives at x
      torch::Tensor z_in = torch::full({2, 3}, mine).requires_grad_(true);
      torch::Tensor z = reduce_from_region(z_in, ctx.comm, all);
      (z * mine).sum().backward(); // identity backward: dL/dz_in = r+1
      GpuGuard host(nullptr);
      copy_out[ctx.rank] = y.detach().clone();
      copy_grad[ctx.rank] = x.grad().clone();
      reduce_out[ctx.rank] = z.detach().clone();
      reduce_grad[ctx.rank] = z_in.grad().clone();
    });
    const double sum = n * (n + 1) / 2.0;
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(copy_out[r], torch::full({2, 3}, r + 1.0)))
          << "n " << n << " rank " << r;
      EXPECT_TRUE(torch::equal(copy_grad[r], torch::full({2, 3}, sum)))
          << "n " << n << " rank " << r;
      EXPECT_TRUE(torch::equal(reduce_out[r], torch::full({2, 3}, sum)))
          << "n " << n << " rank " << r;
      EXPECT_TRUE(torch::equal(reduce_grad[r], torch::full({2, 3}, r + 1.0)))
          << "n " << n << " rank " << r;
    }
  }
}

TEST(TensorParallelMappings, GatherConcatenatesTheSlicesAndKeepsEachMembersGradient) {
  for (int n : {2, 4}) {
    DeviceMesh mesh = tp_mesh(n);
    std::vector<torch::Tensor> out(n), grad(n);
    run_ranks(mesh, [&](RankContext& ctx) {
      torch::Tensor x = torch::full({2, 3}, ctx.rank + 1.0).requires_grad_(true);
      torch::Tensor y = gather_from_region(x, ctx.comm, Group::world(n), ctx.rank);
      (y * torch::arange(3.0 * n)).sum().backward(); // dL/dy[., j] = j
      GpuGuard host(nullptr);
      out[ctx.rank] = y.detach().clone();
      grad[ctx.rank] = x.grad().clone();
    });
    // Member k's slice is columns 3k..3k+2, holding k+1; its gradient is those columns' j.
    const torch::Tensor expected =
        torch::arange(1.0, n + 1.0).repeat_interleave(3).unsqueeze(0).expand({2, 3 * n});
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(out[r], expected)) << "n " << n << " rank " << r;
      EXPECT_TRUE(torch::equal(grad[r], torch::arange(3.0 * r, 3.0 * r + 3).expand({2, 3})))
          << "n " << n << " rank " << r;
    }
  }
}

TEST(TensorParallelMappings, PatternsAndBadPlans) {
  EXPECT_TRUE(pattern_matches("*.attn.q", "block0.attn.q"));
  EXPECT_TRUE(pattern_matches("block*.mlp.*", "block12.mlp.proj"));
  EXPECT_FALSE(pattern_matches("*.attn.q", "block0.attn.qq"));
  EXPECT_FALSE(pattern_matches("*.mlp.fc", "block0.attn.q"));
  DeviceMesh mesh = tp_mesh(1);
  run_ranks(mesh, [&](RankContext& ctx) {
    auto model = build_model("gpt", ModelOptions{0, 0, small_tp_gpt()});
    const Group eight{{0, 1, 2, 3, 4, 5, 6, 7}}; // checks come before any communication
    EXPECT_THROW(parallelize_tensor(model, {{{"*.nothing", ParallelStyle::Column}}}, ctx.comm,
                                    Group::world(1), 0),
                 std::invalid_argument);
    // 4 heads cannot be split over 8 members (q has 32 features = 4 heads of 8).
    EXPECT_THROW(parallelize_tensor(model, gpt_parallel_plan(small_tp_gpt()), ctx.comm, eight, 0),
                 std::invalid_argument);
    EXPECT_THROW(parallelize_tensor(model, {{{"head", ParallelStyle::Column}}}, ctx.comm,
                                    Group::world(1), 0),
                 std::invalid_argument); // the head's parent (the Sequential) holds no slots
    // Nothing was replaced by the failed calls.
    EXPECT_TRUE(model->named_modules()["block0.attn.q"]->as<nn::LinearImpl>() != nullptr);
  });
}

TEST(TensorParallelGpt, LogitsAndGradientsEqualTheUnshardedModel) {
  const Dataset data = synthetic_text(16, 0, 16, 64, 5).train;
  const Dataset b = batch(data, 0);
  const TpReference ref = unsharded_step(b);
  for (int tp : {2, 4}) {
    DeviceMesh mesh = tp_mesh(tp);
    std::vector<torch::Tensor> logits(tp), ln_grad(tp), wte_grad(tp);
    std::vector<std::vector<torch::Tensor>> grads(tp);
    run_ranks(mesh, [&](RankContext& ctx) {
      auto model = sharded_gpt(ctx, Recompute::None);
      allocate_gradients(unique_parameters(*model));
      CategoryScope acts(MemoryCategory::Activations);
      torch::Tensor out = model->forward(b.images);
      loss_fn(out, b.labels).backward();
      auto full = full_gradients(model, ctx.comm, Group::world(tp));
      auto named = model->named_parameters();
      grads[ctx.rank] = host_copies(full);
      logits[ctx.rank] = host_copies({out})[0];
      ln_grad[ctx.rank] = host_copies({named["block1.ln2.weight"].grad()})[0];
      wte_grad[ctx.rank] = host_copies({named["embed.wte"].grad()})[0];
      // The untied head and the embedding hold this member's rows of the vocabulary.
      EXPECT_EQ(named["head.weight"].sizes(), (std::vector<int64_t>{64 / tp, 32}));
      EXPECT_EQ(named["embed.wte"].sizes(), (std::vector<int64_t>{64 / tp, 32}));
    });
    for (int r = 0; r < tp; ++r) {
      EXPECT_LT(tp_relative_error(logits[r], ref.logits), 1e-5) << "tp " << tp << " rank " << r;
      const double g = max_relative_error(grads[r], ref.grads);
      EXPECT_LT(g, 1e-5) << "tp " << tp << " rank " << r;
      // Replicated parameters get bitwise identical gradients on every member.
      EXPECT_TRUE(torch::equal(ln_grad[r], ln_grad[0])) << "tp " << tp << " rank " << r;
      // The embedding's rows: each member's gradient is its rows of the whole one (in grads).
      EXPECT_EQ(wte_grad[r].size(0), 64 / tp) << "tp " << tp << " rank " << r;
      if (r == 0)
        std::cout << "tp " << tp << ": logits rel err " << tp_relative_error(logits[r], ref.logits)
                  << ", worst gradient rel err " << g << "\n";
    }
  }
}

// In float64, both runs: within the derived kFloat64Tolerance (tests/parallel/strategy_harness.h).
TEST(TensorParallelGpt, TenSgdStepsMatchTheUnshardedModel) {
  constexpr double kTolerance = 1e-9;
  const Dataset data = synthetic_text(64, 0, 16, 64, 5).train;
  // Reference: the unsharded model, the same batches, meshsim's SGD.
  auto ref = build_model("gpt", ModelOptions{kTpSeed, 0, small_tp_gpt(), torch::kFloat64});
  auto ref_params = unique_parameters(*ref);
  allocate_gradients(ref_params);
  Optimizer ref_opt(ref_params, tp_sgd());
  std::vector<double> ref_losses;
  for (int k = 0; k < 10; ++k) {
    const Dataset b = batch(data, k);
    ref_opt.zero_grad();
    torch::Tensor loss = loss_fn(ref->forward(b.images), b.labels);
    loss.backward();
    ref_opt.step();
    ref_losses.push_back(loss.item<double>());
  }
  for (int tp : {2, 4}) {
    DeviceMesh mesh = tp_mesh(tp);
    std::vector<double> losses;
    std::vector<torch::Tensor> final_params;
    run_ranks(mesh, [&](RankContext& ctx) {
      // tp=4 trains with checkpointing too
      auto model = sharded_gpt(ctx, tp == 4 ? Recompute::Full : Recompute::None, torch::kFloat64);
      auto params = unique_parameters(*model);
      allocate_gradients(params);
      Optimizer opt(params, tp_sgd());
      for (int k = 0; k < 10; ++k) {
        const Dataset b = batch(data, k);
        opt.zero_grad();
        CategoryScope acts(MemoryCategory::Activations);
        torch::Tensor loss = loss_fn(model->forward(b.images), b.labels);
        loss.backward();
        opt.step();
        if (ctx.rank == 0)
          losses.push_back(loss.item<double>());
      }
      auto full = full_parameters(model, ctx.comm, Group::world(tp));
      if (ctx.rank == 0)
        final_params = host_copies(full);
    });
    ASSERT_EQ(losses.size(), ref_losses.size());
    for (size_t k = 0; k < losses.size(); ++k)
      EXPECT_NEAR(losses[k], ref_losses[k], kTolerance * std::abs(ref_losses[k]))
          << "tp " << tp << " step " << k + 1;
    const double p = max_relative_error(final_params, host_copies(ref_params));
    EXPECT_LT(p, kTolerance) << "tp " << tp;
    std::cout << "tp " << tp << ": loss " << ref_losses.front() << " -> " << ref_losses.back()
              << " (unsharded), " << losses.front() << " -> " << losses.back()
              << " (sharded); worst final parameter rel err " << p << "\n";
  }
}

TEST(TensorParallelGpt, RecomputeGivesTheSameLossAndGradientsAtTp2) {
  const Dataset b = batch(synthetic_text(8, 0, 16, 64, 5).train, 0);
  const std::vector<Recompute> modes{Recompute::None, Recompute::Selective, Recompute::Full};
  std::vector<double> loss(modes.size());
  std::vector<std::vector<torch::Tensor>> grads(modes.size());
  DeviceMesh mesh = tp_mesh(2);
  run_ranks(mesh, [&](RankContext& ctx) {
    for (size_t m = 0; m < modes.size(); ++m) {
      auto model = sharded_gpt(ctx, modes[m]);
      allocate_gradients(unique_parameters(*model));
      torch::Tensor l = loss_fn(model->forward(b.images), b.labels);
      l.backward();
      auto full = full_gradients(model, ctx.comm, Group::world(2));
      if (ctx.rank == 0) {
        loss[m] = l.item<double>();
        grads[m] = host_copies(full);
      }
    }
  });
  for (size_t m = 1; m < modes.size(); ++m) {
    EXPECT_NEAR(loss[m], loss[0], 1e-6) << "mode " << m;
    ASSERT_EQ(grads[m].size(), grads[0].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_LT((grads[m][i] - grads[0][i]).abs().max().item<double>(), 1e-6)
          << "mode " << m << " param " << i;
  }
}

TEST(TensorParallelGpt, ShardedBlockHoldsItsShareOfParameters) {
  const int64_t h = small_tp_gpt().hidden;
  const int64_t full_block = 12 * h * h + 13 * h;
  const int64_t replicated = 4 * h /* ln1, ln2 */ + 2 * h /* attn.out and mlp.proj biases */;
  const int64_t expected = (full_block - replicated) / 2 + replicated;
  std::vector<int64_t> block_params(2);
  std::vector<std::vector<std::string>> names(2);
  DeviceMesh mesh = tp_mesh(2);
  run_ranks(mesh, [&](RankContext& ctx) {
    auto model = sharded_gpt(ctx, Recompute::None);
    block_params[ctx.rank] = count_parameters(*model->named_children()["block0"]);
    for (const auto& item : model->named_parameters())
      names[ctx.rank].push_back(item.key());
  });
  auto unsharded = build_model("gpt", ModelOptions{kTpSeed, 0, small_tp_gpt()});
  std::vector<std::string> unsharded_names;
  for (const auto& item : unsharded->named_parameters())
    unsharded_names.push_back(item.key());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(block_params[r], expected) << "rank " << r; // 6448 for H = 32
    EXPECT_EQ(names[r], unsharded_names) << "rank " << r; // same parameters, same order
  }
}
