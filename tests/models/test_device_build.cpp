// Models built directly on a device: the Linear and LayerNorm that create their parameters
// where they are asked to (as the stock ones would on the CPU), a GPT-3 175B shape built on
// the meta device in no host memory, tensor-parallel slicing of a meta model, and a Llama
// block's forward and backward on meta (what a plan runs).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/device_layers.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "parallel/tensor/tensor_parallel.h"

using namespace meshsim;
namespace nn = torch::nn;
namespace F = torch::nn::functional;

namespace {

// Resident set size of this process, from /proc/self/statm (pages).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

TransformerShape gpt3_175b() {
  TransformerShape o; // Brown et al. 2020, Table 2.1; vocabulary padded as Megatron pads it
  o.layers = 96;
  o.hidden = 12288;
  o.heads = 96;
  o.seq_len = 2048;
  o.vocab = 51200;
  return o;
}

} // namespace

TEST(DeviceLayers, LinearIsAnNnLinearWithItsOwnParameters) {
  const auto t = torch::TensorOptions().dtype(torch::kFloat64);
  nn::Linear lin = make_linear(3, 5, true, t);
  ASSERT_NE(lin->as<nn::Linear>(), nullptr); // what models/layers/flops.cpp asks
  EXPECT_NE(std::dynamic_pointer_cast<nn::LinearImpl>(lin.ptr()), nullptr); // tensor parallel
  EXPECT_EQ(lin->options.in_features(), 3);
  EXPECT_EQ(lin->options.out_features(), 5);
  const auto named = lin->named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].key(), "weight");
  EXPECT_EQ(named[1].key(), "bias");
  // The registered tensors are the public fields, full size, in the requested dtype.
  EXPECT_TRUE(named[0].value().is_same(lin->weight));
  EXPECT_TRUE(named[1].value().is_same(lin->bias));
  EXPECT_EQ(lin->weight.sizes(), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(lin->bias.sizes(), (std::vector<int64_t>{5}));
  EXPECT_EQ(lin->weight.dtype(), torch::kFloat64);
  EXPECT_TRUE(lin->weight.requires_grad() && lin->bias.requires_grad());

  {
    torch::NoGradGuard no_grad;
    lin->weight.copy_(torch::arange(15, t).view({5, 3}));
    lin->bias.copy_(torch::arange(5, t));
  }
  const torch::Tensor x = torch::arange(6, t).view({2, 3});
  const torch::Tensor y = lin->forward(x);
  // Integers below 2^53: the products and sums are exact in float64.
  EXPECT_TRUE(torch::equal(y, torch::matmul(x, torch::arange(15, t).view({5, 3}).t()) +
                                  torch::arange(5, t)));
  y.sum().backward();
  ASSERT_TRUE(lin->weight.grad().defined());
  EXPECT_TRUE(torch::equal(lin->bias.grad(), torch::full({5}, 2.0, t))); // two rows

  nn::Linear no_bias = make_linear(4, 2, false, {});
  EXPECT_EQ(no_bias->parameters().size(), 1u);
  EXPECT_FALSE(no_bias->bias.defined());
}

TEST(DeviceLayers, LayerNormIsAnNnLayerNormStartingAtOneAndZero) {
  nn::LayerNorm ln = make_layer_norm(6, torch::TensorOptions().dtype(torch::kFloat64));
  ASSERT_NE(ln->as<nn::LayerNorm>(), nullptr);
  EXPECT_EQ(ln->options.normalized_shape(), (std::vector<int64_t>{6}));
  ASSERT_EQ(ln->parameters().size(), 2u);
  EXPECT_TRUE(torch::equal(ln->weight, torch::ones({6}, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(ln->bias, torch::zeros({6}, torch::kFloat64)));
  EXPECT_TRUE(ln->weight.requires_grad());
  const torch::Tensor x = torch::randn({3, 6}, torch::kFloat64);
  EXPECT_TRUE(torch::equal(ln->forward(x), F::layer_norm(x, F::LayerNormFuncOptions({6}))));
}

TEST(DeviceLayers, MetaLayersHaveShapesOnly) {
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16);
  nn::Linear lin = make_linear(8, 16, true, meta);
  nn::LayerNorm ln = make_layer_norm(8, meta);
  for (const auto& p : lin->parameters())
    EXPECT_TRUE(p.is_meta() && p.dtype() == torch::kBFloat16);
  for (const auto& p : ln->parameters())
    EXPECT_TRUE(p.is_meta() && p.dtype() == torch::kBFloat16);
  const torch::Tensor y = lin->forward(torch::empty({2, 8}, meta));
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 16}));
}

TEST(MetaModels, Gpt175BOnMetaInNoHostMemory) {
  const TransformerShape o = gpt3_175b();
  ModelOptions mo;
  mo.shape = o;
  mo.device = torch::kMeta;
  mo.dtype = torch::kBFloat16;
  const int64_t rss_before = resident_bytes();
  const auto start = std::chrono::steady_clock::now();
  auto model = build_model("gpt", mo);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t grown = resident_bytes() - rss_before;
  EXPECT_EQ(count_parameters(*model), gpt_parameter_count(o));
  EXPECT_GT(gpt_parameter_count(o), int64_t{174'000'000'000}); // 175B: the right shape
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(p.is_meta());
    EXPECT_EQ(p.dtype(), torch::kBFloat16);
    EXPECT_TRUE(p.requires_grad());
  }
  // Its weights alone would be 350 GB in bf16; what a build may keep on the host is the
  // module objects: ~1,000 modules of a few KiB each, so a few MiB. 64 MiB leaves room
  // for the allocator's arenas and still catches a single real weight (a 12288^2 Linear
  // is 288 MiB in bf16).
  EXPECT_LT(grown, int64_t{64} << 20);
  std::cout << "gpt 175B (" << count_parameters(*model) << " parameters) built on meta in "
            << seconds << " s; resident set grew " << grown / 1024 << " KiB\n";
}

TEST(MetaModels, CnnAndLenetRefuseMeta) {
  ModelOptions mo;
  mo.device = torch::kMeta;
  EXPECT_THROW(build_model("cnn", mo), std::invalid_argument);
  EXPECT_THROW(build_model("lenet", mo), std::invalid_argument);
}

TEST(MetaModels, MetaGptMatchesTheCpuOneInShapeAndNames) {
  TransformerShape o;
  o.ffn_hidden = 96; // not 4H: GPT honours it
  ModelOptions cpu;
  cpu.shape = o;
  ModelOptions meta = cpu;
  meta.device = torch::kMeta;
  meta.dtype = torch::kFloat64;
  const auto a = build_model("gpt", cpu)->named_parameters();
  const auto b = build_model("gpt", meta)->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].key(), b[i].key());
    EXPECT_EQ(a[i].value().sizes(), b[i].value().sizes()) << a[i].key();
    EXPECT_EQ(b[i].value().dtype(), torch::kFloat64) << b[i].key();
  }
  EXPECT_EQ(build_model("gpt", cpu)->named_parameters()["block0.mlp.fc.weight"].size(0), 96);
}

TEST(MetaModels, TensorParallelSlicesAMetaGpt) {
  TransformerShape o;
  o.hidden = 1024;
  o.heads = 16;
  o.layers = 2;
  MeshOptions mesh_options;
  mesh_options.world_size = 2;
  mesh_options.capacity_bytes = int64_t{1} << 30;
  DeviceMesh mesh(mesh_options);
  std::vector<int64_t> counts(2);
  run_ranks(mesh, [&](RankContext& ctx) {
    ModelOptions mo;
    mo.shape = o;
    mo.device = torch::kMeta;
    auto model = build_model("gpt", mo);
    parallelize_tensor(model, gpt_parallel_plan(o), ctx.comm, Group::world(2), ctx.rank);
    for (const auto& p : model->parameters())
      EXPECT_TRUE(p.is_meta());
    const auto params = model->named_parameters();
    EXPECT_EQ(params["block0.attn.q.weight"].sizes(), (std::vector<int64_t>{512, 1024}));
    EXPECT_EQ(params["block1.mlp.proj.weight"].sizes(), (std::vector<int64_t>{1024, 2048}));
    counts[ctx.rank] = count_parameters(*model);
  });
  // Each member holds half of every sharded tensor and all of the rest. Sharded per block:
  // the weights (q, k, v, out: 4H^2; fc, proj: 8H^2) and the column biases (q, k, v, fc: 7H);
  // replicated: the row biases and the LayerNorms. The untied head [V, H] and the word
  // embedding [V, H] are split over the vocabulary.
  const int64_t h = o.hidden, sharded = o.layers * (12 * h * h + 7 * h) + 2 * o.vocab * h;
  EXPECT_EQ(counts[0], gpt_parameter_count(o) - sharded / 2);
  EXPECT_EQ(counts[1], counts[0]);
}

TEST(MetaModels, LlamaBlockRunsForwardAndBackwardOnMeta) {
  // Everything in a Llama block has a meta kernel in 1.13 (RMSNorm, rotary's arange, pow,
  // outer, cos, cat; grouped-query expand; softmax, matmul). The embedding does not
  // (index_select): meshsim plan registers one.
  TransformerShape o;
  o.hidden = 256;
  o.heads = 8;
  o.kv_heads = 2;
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16);
  LlamaBlock block(o, meta);
  const torch::Tensor x = torch::empty({2, 16, 256}, meta).requires_grad_(true);
  const torch::Tensor y = block->forward(x);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.dtype(), torch::kBFloat16);
  y.sum().backward();
  for (const auto& p : block->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(p.grad().is_meta());
    EXPECT_EQ(p.grad().sizes(), p.sizes());
  }
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}
