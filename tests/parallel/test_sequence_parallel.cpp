// Sequence parallelism against exactly known values (the four mappings, forward and
// backward) and against the unsharded GPT and Llama: logits and every gradient, once the
// partial gradients of the sequence-split parameters are summed over the group; and the
// shape of the model it builds (where the sequence is split and gathered, which parameters
// see only part of it).
#include <gtest/gtest.h>

#include <iostream>

#include "data/text.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/gpt.h"
#include "parallel/tensor/sequence_parallel.h"
#include "parallel/strategy.h"
#include "parallel/tensor/tensor_parallel.h"

using namespace meshsim;
namespace nn = torch::nn;

namespace {

DeviceMesh make_mesh(int world) {
  MeshOptions o;
  o.world_size = world;
  o.capacity_bytes = int64_t{1} << 30;
  return DeviceMesh(o);
}

torch::Tensor host_copy(const torch::Tensor& t) {
  GpuGuard host(nullptr);
  return t.detach().clone();
}

// [1, 2n, 3] whose sequence part j (positions 2j, 2j+1) holds `value(j)`.
torch::Tensor by_part(int n, const std::function<double(int)>& value) {
  std::vector<torch::Tensor> parts;
  for (int j = 0; j < n; ++j)
    parts.push_back(torch::full({1, 2, 3}, value(j), torch::kFloat64));
  return torch::cat(parts, 1);
}

TransformerShape small_shape() {
  TransformerShape o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.kv_heads = 2; // llama: each of 2 members keeps one kv head
  o.ffn_hidden = 64;
  o.seq_len = 16;
  o.vocab = 64;
  return o;
}

} // namespace

// Rank r holds r + 1 (or part j holds j + 1): every sum is n(n+1)/2 exactly.
TEST(SequenceParallelMappings, ExactValuesForwardAndBackward) {
  for (int n : {2, 4}) {
    DeviceMesh mesh = make_mesh(n);
    std::vector<std::vector<torch::Tensor>> got(n);
    run_ranks(mesh, [&](RankContext& ctx) {
      const Group all = Group::world(n);
      const double mine = ctx.rank + 1;
      auto& out = got[ctx.rank];
      // scatter: the replicated input's own part; the gradient all-gathered along the sequence
      torch::Tensor a = by_part(n, [](int j) { return 10.0 * (j + 1); }).requires_grad_(true);
      torch::Tensor a_out = scatter_to_sequence_region(a, ctx.comm, all);
      (a_out * mine).sum().backward();
      // gather to the head: all parts; backward keeps the own part of the (whole) gradient
      torch::Tensor b = torch::full({1, 2, 3}, mine, torch::kFloat64).requires_grad_(true);
      torch::Tensor b_out = gather_from_sequence_region(b, ctx.comm, all);
      (b_out * by_part(n, [](int j) { return 100.0 * (j + 1); })).sum().backward();
      // gather to a column layer: all parts; backward reduce-scatters the members' gradients
      torch::Tensor c = torch::full({1, 2, 3}, mine, torch::kFloat64).requires_grad_(true);
      torch::Tensor c_out = gather_to_tensor_region(c, ctx.comm, all);
      (c_out * mine).sum().backward();
      // reduce-scatter a row layer's partial sums; backward all-gathers the parts' gradients
      torch::Tensor d = torch::full({1, 2 * n, 3}, mine, torch::kFloat64).requires_grad_(true);
      torch::Tensor d_out = reduce_scatter_to_sequence_region(d, ctx.comm, all);
      (d_out * mine).sum().backward();
      for (const auto& t : {a_out, a.grad(), b_out, b.grad(), c_out, c.grad(), d_out, d.grad()})
        out.push_back(host_copy(t));
    });
    const double sum = n * (n + 1) / 2.0;
    for (int r = 0; r < n; ++r) {
      const auto& g = got[r];
      const std::string where = "n " + std::to_string(n) + " rank " + std::to_string(r);
      EXPECT_TRUE(torch::equal(g[0], torch::full({1, 2, 3}, 10.0 * (r + 1), torch::kFloat64)))
          << where;
      EXPECT_TRUE(torch::equal(g[1], by_part(n, [](int j) { return j + 1.0; }))) << where;
      EXPECT_TRUE(torch::equal(g[2], by_part(n, [](int j) { return j + 1.0; }))) << where;
      EXPECT_TRUE(torch::equal(g[3], torch::full({1, 2, 3}, 100.0 * (r + 1), torch::kFloat64)))
          << where;
      EXPECT_TRUE(torch::equal(g[4], by_part(n, [](int j) { return j + 1.0; }))) << where;
      EXPECT_TRUE(torch::equal(g[5], torch::full({1, 2, 3}, sum, torch::kFloat64))) << where;
      EXPECT_TRUE(torch::equal(g[6], torch::full({1, 2, 3}, sum, torch::kFloat64))) << where;
      EXPECT_TRUE(torch::equal(g[7], by_part(n, [](int j) { return j + 1.0; }))) << where;
    }
  }
}

TEST(SequenceParallelMappings, GradientsOfPartialParametersAreSummedInOneAllReduce) {
  DeviceMesh mesh = make_mesh(3);
  std::vector<torch::Tensor> got(3);
  std::vector<size_t> records(3);
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::Tensor w = torch::zeros({2, 2}, torch::kFloat64).requires_grad_(true);
    torch::Tensor b = torch::zeros({5}, torch::kFloat64).requires_grad_(true);
    w.mutable_grad() = torch::full({2, 2}, ctx.rank + 1.0, torch::kFloat64);
    b.mutable_grad() = torch::full({5}, 10.0 * (ctx.rank + 1), torch::kFloat64);
    const size_t before = ctx.comm.records().size();
    all_reduce_sequence_parallel_gradients({w, b}, ctx.comm, Group::world(3));
    records[ctx.rank] = ctx.comm.records().size() - before;
    got[ctx.rank] = host_copy(torch::cat({w.grad().reshape({-1}), b.grad()}));
  });
  torch::Tensor expected =
      torch::cat({torch::full({4}, 6.0, torch::kFloat64), torch::full({5}, 60.0, torch::kFloat64)});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(torch::equal(got[r], expected)) << "rank " << r;
    EXPECT_EQ(records[r], 1u) << "rank " << r;
  }
}

// The sharded model, sequence parallel, against the unsharded one: the same logits and, after
// the partial gradients are summed, the same gradients (all-gathered), in float64.
TEST(SequenceParallelModels, LogitsAndGradientsEqualTheUnshardedModel) {
  constexpr double kTolerance = 1e-12;
  const Dataset data = synthetic_text(16, 0, 16, 64, 5).train;
  auto [tokens, targets] = gather_batch(data, {0, 1, 2, 3});
  for (const std::string model_name : {"gpt", "llama"}) {
    const ModelOptions options{7, 0, small_shape(), torch::kFloat64};
    auto ref = build_model(model_name, options);
    torch::Tensor ref_logits = ref->forward(tokens);
    loss_fn(ref_logits, targets).backward();
    std::vector<torch::Tensor> ref_grads;
    for (const auto& p : unique_parameters(*ref))
      ref_grads.push_back(p.grad());
    // The Llama's 2 kv heads split over 2 members at most.
    for (int tp : model_name == "gpt" ? std::vector<int>{2, 4} : std::vector<int>{2}) {
      DeviceMesh mesh = make_mesh(tp);
      std::vector<torch::Tensor> logits(tp);
      std::vector<std::vector<torch::Tensor>> grads(tp);
      std::vector<std::vector<std::string>> children(tp);
      std::vector<size_t> partial(tp);
      run_ranks(mesh, [&](RankContext& ctx) {
        const Group all = Group::world(tp);
        const ParallelPlan plan = parallel_plan(model_name, small_shape());
        nn::Sequential model;
        {
          CategoryScope params(MemoryCategory::Parameters);
          model = build_model(model_name, options);
          parallelize_tensor(model, plan, ctx.comm, all, ctx.rank, /*sequence_parallel=*/true);
        }
        allocate_gradients(unique_parameters(*model));
        CategoryScope acts(MemoryCategory::Activations);
        torch::Tensor out = model->forward(tokens);
        loss_fn(out, targets).backward();
        const auto sequence_params = sequence_parallel_parameters(model, plan);
        all_reduce_sequence_parallel_gradients(sequence_params, ctx.comm, all);
        const auto full = full_gradients(model, ctx.comm, all);
        GpuGuard host(nullptr);
        logits[ctx.rank] = out.detach().clone();
        for (const auto& g : full)
          grads[ctx.rank].push_back(g.clone());
        for (const auto& item : model->named_children())
          children[ctx.rank].push_back(item.key());
        partial[ctx.rank] = sequence_params.size();
      });
      const std::string last_norm = model_name == "gpt" ? "ln_f" : "norm_f";
      const std::vector<std::string> expected_children = {
          "embed", "sequence_scatter", "block0", "block1", last_norm, "sequence_gather", "head"};
      // GPT: per block ln1 and ln2 (weight, bias) and the two row biases, then ln_f's two;
      // Llama: per block its two RMSNorm weights, then norm_f's.
      const size_t expected_partial = model_name == "gpt" ? 2 * 6 + 2 : 2 * 2 + 1;
      for (int r = 0; r < tp; ++r) {
        const std::string where =
            model_name + " tp " + std::to_string(tp) + " rank " + std::to_string(r);
        EXPECT_EQ(children[r], expected_children) << where;
        EXPECT_EQ(partial[r], expected_partial) << where;
        EXPECT_LT((logits[r] - ref_logits).abs().max().item<double>(), kTolerance) << where;
        ASSERT_EQ(grads[r].size(), ref_grads.size()) << where;
        double worst = 0;
        for (size_t i = 0; i < ref_grads.size(); ++i)
          worst = std::max(worst, (grads[r][i] - ref_grads[i]).abs().max().item<double>());
        EXPECT_LT(worst, kTolerance) << where;
        if (r == 0)
          std::cout << where << ": worst gradient abs. error " << worst << "\n";
      }
    }
  }
}

TEST(SequenceParallelModels, RefusesAModelWithoutTheChildrenToSplitBetween) {
  DeviceMesh mesh = make_mesh(1);
  run_ranks(mesh, [&](RankContext& ctx) {
    auto model = build_model("gpt", ModelOptions{0, 0, small_shape()});
    ParallelPlan plan = gpt_parallel_plan(small_shape());
    plan.sequence_before = "lm_head";
    EXPECT_THROW(parallelize_tensor(model, plan, ctx.comm, Group::world(1), 0, true),
                 std::invalid_argument);
    // Nothing was replaced by the failed call.
    EXPECT_TRUE(model->named_modules()["block0.attn.q"]->as<nn::LinearImpl>() != nullptr);
  });
}
