// FLOP and byte counts of known layers, against numbers worked out by hand from the
// conventions in models/layers/flops.h.
#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "models/layers/flops.h"
#include "models/llama.h"
#include "models/models.h"

namespace meshsim {
namespace {

namespace nn = torch::nn;

// q, k, v, out projections: what the GPT model's attention module is made of. It says it is
// attention (AttentionHeads) with all d query features and no head width, so no scores are
// counted as written.
struct ProjectionsImpl : nn::Module, AttentionHeads {
  explicit ProjectionsImpl(int64_t d)
      : q(register_module("q", nn::Linear(d, d))), k(register_module("k", nn::Linear(d, d))),
        v(register_module("v", nn::Linear(d, d))), out(register_module("out", nn::Linear(d, d))),
        d_(d) {}
  int64_t head_dim() const override { return 0; }
  int64_t query_features() const override { return d_; }
  nn::Linear q, k, v, out;
  int64_t d_;
};

TEST(CostFlops, LinearIsTwoMnkPlusBias) {
  nn::Linear fc(128, 10);
  const LayerWork w = count_layer("fc", *fc, {2, 128}, {2, 10});
  EXPECT_EQ(w.op, "matmul");
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 2 * 128 * 10 + 2 * 10);
  EXPECT_DOUBLE_EQ(w.bytes, (2 * 128 + 2 * 10) * 4.0 + (128 * 10 + 10) * 4.0);
  EXPECT_EQ(w.param_bytes, (128 * 10 + 10) * 4);
  nn::Linear no_bias(nn::LinearOptions(128, 10).bias(false));
  EXPECT_DOUBLE_EQ(count_layer("fc", *no_bias, {3, 5, 128}, {3, 5, 10}).flops, 2.0 * 15 * 128 * 10);
}

// A backward keeps the attention core's share of its GEMMs (what an FP8 plan leaves in bf16):
// twice the forward's core, the fused core's recomputed scores, and under full recomputation
// the forward's core once more; the linear GEMMs are the rest.
TEST(CostFlops, ABackwardKnowsItsAttentionCoresShare) {
  LayerWork fused;
  fused.layer = "block0";
  fused.op = "matmul";
  fused.gemm_flops = fused.flops = 10e12;
  fused.attention_flops = 2e12;
  fused.rerun_flops = 1e12; // the fused core's S = QKᵀ again
  fused.gemms = 6;
  fused.kernels = 9;
  const LayerWork b = backward_work({fused}).front();
  EXPECT_DOUBLE_EQ(b.gemm_flops, 2 * 10e12 + 1e12);
  EXPECT_DOUBLE_EQ(b.attention_flops, 2 * 2e12 + 1e12);
  LayerWork full = fused; // --recompute full: the whole forward again, and the scores
  full.rerun_flops = full.flops + 1e12;
  const LayerWork c = backward_work({full}).front();
  EXPECT_DOUBLE_EQ(c.gemm_flops, 3 * 10e12 + 1e12);
  EXPECT_DOUBLE_EQ(c.attention_flops, 3 * 2e12 + 1e12);
  LayerWork mlp = fused; // no attention: nothing of it is the core's
  mlp.attention_flops = mlp.rerun_flops = 0;
  EXPECT_DOUBLE_EQ(backward_work({mlp}).front().attention_flops, 0);
}

// An attention whose core is eager or fused, kept by op-level recomputation or not (the ring
// context-parallel core is fused and not kept): heads of 8.
struct CoreAttentionImpl : nn::Module, AttentionHeads {
  CoreAttentionImpl(int64_t d, bool fused, bool kept)
      : q(register_module("q", nn::Linear(d, d))), d_(d), fused_(fused), kept_(kept) {}
  int64_t head_dim() const override { return 8; }
  int64_t query_features() const override { return d_; }
  bool fused_core() const override { return fused_; }
  bool core_kept_under_op() const override { return kept_; }
  nn::Linear q;
  int64_t d_;
  bool fused_, kept_;
};

// Only an eager core records its scores' traffic, whether or not op-level recomputation keeps
// a fused one; only a kept core's work is what op-level recomputation keeps.
TEST(CostFlops, OnlyAnEagerCoreMovesScoresAndOnlyAKeptCoreIsKept) {
  for (const auto& [fused, kept] :
       {std::pair<bool, bool>{false, false}, {true, false}, {true, true}}) {
    const auto m = std::make_shared<CoreAttentionImpl>(32, fused, kept);
    const LayerWork w = count_layer("attn", *m, {2, 16, 32}, {2, 16, 32});
    EXPECT_GT(w.attention_flops, 0);
    EXPECT_EQ(w.score_bytes > 0, !fused) << fused << kept;
    EXPECT_DOUBLE_EQ(w.kept_core_flops, kept ? w.attention_flops : 0) << fused << kept;
  }
}

TEST(CostFlops, Conv2dCountsEveryOutputElement) {
  nn::Conv2d conv(nn::Conv2dOptions(32, 64, 3).padding(1));
  const LayerWork w = count_layer("conv2", *conv, {2, 32, 14, 14}, {2, 64, 14, 14});
  const double outputs = 2.0 * 64 * 14 * 14;
  EXPECT_DOUBLE_EQ(w.flops, 2 * outputs * 32 * 9 + outputs);
  EXPECT_DOUBLE_EQ(w.bytes, (2.0 * 32 * 14 * 14 + outputs) * 4 + (64 * 32 * 9 + 64) * 4.0);
}

TEST(CostFlops, ElementwiseNormalizationAndViews) {
  nn::ReLU relu;
  const LayerWork r = count_layer("relu", *relu, {4, 100}, {4, 100});
  EXPECT_EQ(r.op, "elementwise");
  EXPECT_DOUBLE_EQ(r.flops, 400);
  EXPECT_DOUBLE_EQ(r.bytes, 800 * 4);
  nn::GELU gelu;
  EXPECT_DOUBLE_EQ(count_layer("gelu", *gelu, {4, 100}, {4, 100}).flops, 8 * 400);
  nn::MaxPool2d pool(2);
  const LayerWork p = count_layer("pool", *pool, {2, 32, 28, 28}, {2, 32, 14, 14});
  EXPECT_DOUBLE_EQ(p.flops, 4.0 * 2 * 32 * 14 * 14);
  nn::LayerNorm ln(nn::LayerNormOptions({16}));
  const LayerWork n = count_layer("ln", *ln, {2, 8, 16}, {2, 8, 16});
  EXPECT_EQ(n.op, "normalization");
  EXPECT_DOUBLE_EQ(n.flops, 5.0 * 256);
  EXPECT_DOUBLE_EQ(n.bytes, 512 * 4.0 + 32 * 4.0);
  nn::Flatten flatten;
  EXPECT_DOUBLE_EQ(count_layer("flatten", *flatten, {2, 64, 7, 7}, {2, 3136}).flops, 0);
}

TEST(CostFlops, AttentionAddsQkAndAvMatmuls) {
  const int64_t b = 2, s = 8, d = 16;
  auto attention = std::make_shared<ProjectionsImpl>(d);
  const LayerWork w = count_layer("attn", *attention, {b, s, d}, {b, s, d});
  const double rows = b * s;
  const double projections = 4 * (2 * rows * d * d + rows * d);
  EXPECT_DOUBLE_EQ(w.flops, projections + 4.0 * b * s * s * d);
}

TEST(CostFlops, CnnForwardLayerByLayer) {
  const auto model = build_model("cnn", ModelOptions{0, 0, {}});
  const auto layers = count_forward(model, torch::zeros({2, 1, 28, 28}));
  ASSERT_EQ(layers.size(), 10u);
  EXPECT_EQ(layers[0].layer, "conv1");
  EXPECT_DOUBLE_EQ(layers[0].flops, 2.0 * 50176 * 9 + 50176);
  EXPECT_DOUBLE_EQ(layers[0].bytes, (1568 + 50176) * 4.0 + 320 * 4.0);
  EXPECT_DOUBLE_EQ(layers[1].flops, 50176);                     // relu1
  EXPECT_DOUBLE_EQ(layers[2].flops, 4.0 * 12544);               // pool1
  EXPECT_DOUBLE_EQ(layers[3].flops, 2.0 * 25088 * 288 + 25088); // conv2
  EXPECT_DOUBLE_EQ(layers[6].flops, 0);                         // flatten
  EXPECT_DOUBLE_EQ(layers[7].flops, 2.0 * 2 * 3136 * 128 + 256);
  EXPECT_DOUBLE_EQ(layers[9].flops, 2.0 * 2 * 128 * 10 + 20);
  int64_t params = 0;
  for (const auto& w : layers)
    params += w.param_bytes;
  EXPECT_EQ(params, 421642 * 4);

  const auto backward = backward_work(layers);
  EXPECT_EQ(backward.front().layer, "fc2");
  EXPECT_DOUBLE_EQ(backward.front().flops, 2 * layers[9].flops); // matmul: 2x
  EXPECT_DOUBLE_EQ(backward[8].flops, layers[1].flops);          // relu1: 1x
  EXPECT_DOUBLE_EQ(backward[8].bytes, 2 * layers[1].bytes);

  ComputeRecord record;
  attach_work(record, layers);
  EXPECT_EQ(record.op, "matmul");
  double sum = 0;
  for (const auto& w : layers)
    sum += w.flops;
  EXPECT_DOUBLE_EQ(record.flops, sum);
}

TEST(CostFlops, OptimizerWorkPerParameter) {
  const LayerWork adam = optimizer_work(1000, "adam", true);
  EXPECT_DOUBLE_EQ(adam.bytes, 28000);
  EXPECT_EQ(adam.op, "optimizer");
  EXPECT_DOUBLE_EQ(optimizer_work(1000, "sgd", false).bytes, 12000);
  EXPECT_DOUBLE_EQ(optimizer_work(1000, "sgd", true).bytes, 20000);
}

// The elementwise kernels a Llama block runs outside its child modules (flops.h,
// ElementwiseWork): each counted once, as one kernel, and nothing else changed.
// A small Llama block's shape with grouped kv heads: 4 heads of 8, 2 kv heads, SwiGLU of 48.
TransformerShape grouped_llama_shape() {
  TransformerShape shape;
  shape.hidden = 32;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.ffn_hidden = 48;
  return shape;
}

TEST(CostFlops, ABlockCountsItsResidualAddsSwigluAndRotation) {
  const TransformerShape shape = grouped_llama_shape();
  const int64_t b = 2, s = 8, h = shape.hidden, f = shape.ffn_hidden;
  const double rows = b * s, eb = 2, d = static_cast<double>(h / shape.heads);
  LlamaBlock block(shape);
  TransformerShape unrotated_shape = shape;
  unrotated_shape.rope_theta = 0;
  LlamaBlock unrotated(unrotated_shape);
  const auto count = [&](const LlamaBlock& of, const char* child) {
    return count_layer(child, *of->named_children()[child], {b, s, h}, {b, s, h}, eb);
  };
  const LayerWork attn = count(block, "attn"), plain = count(unrotated, "attn");
  // q (heads·d features) and k (kv_heads·d) rotated: 3 FLOPs an element, read and written.
  const double rotated = rows * static_cast<double>(shape.heads + shape.kv_heads) * d;
  EXPECT_DOUBLE_EQ(attn.flops - plain.flops, 3 * rotated);
  EXPECT_DOUBLE_EQ(attn.bytes - plain.bytes, 2 * rotated * eb);
  EXPECT_EQ(attn.kernels - plain.kernels, 2);
  EXPECT_DOUBLE_EQ(attn.gemm_flops, plain.gemm_flops);

  // SiLU (5 FLOPs, one read, one written) and the product (1, two read, one written) on the
  // rows × F gate output; the rest is the three GEMMs.
  const LayerWork mlp = count(block, "mlp");
  EXPECT_DOUBLE_EQ(mlp.flops - mlp.gemm_flops, 6 * rows * f);
  EXPECT_DOUBLE_EQ(mlp.bytes - mlp.gemm_bytes, 5 * rows * f * eb);
  EXPECT_EQ(mlp.kernels - mlp.gemms, 2);

  // The block: its parts plus two residual adds (1 FLOP an element, two read, one written).
  const LayerWork whole = count_layer("block", *block, {b, s, h}, {b, s, h}, eb);
  const LayerWork norm = count(block, "attn_norm");
  EXPECT_DOUBLE_EQ(whole.flops, 2 * norm.flops + attn.flops + mlp.flops + 2 * rows * h);
  EXPECT_DOUBLE_EQ(whole.bytes, 2 * norm.bytes + attn.bytes + mlp.bytes + 2 * 3 * rows * h * eb);
  EXPECT_EQ(whole.kernels, 2 * norm.kernels + attn.kernels + mlp.kernels + 2);
}

// Counted eager (--elementwise eager, as PyTorch runs a block without torch.compile), RMSNorm
// is its forward's eight ops and the rotation its five, each a kernel; the GEMMs are the same.
TEST(CostFlops, EagerElementwiseCountsRmsNormAndTheRotationOpByOp) {
  const TransformerShape shape = grouped_llama_shape();
  const int64_t b = 2, s = 8, h = shape.hidden;
  const double rows = b * s, eb = 2, d = static_cast<double>(h / shape.heads);
  LlamaBlock fused(shape), eager(shape);
  for (const auto& module : eager->modules(/*include_self=*/false))
    if (auto* counted = dynamic_cast<ElementwiseWork*>(module.get()))
      counted->set_eager_kernels(true);
  const auto count = [&](const LlamaBlock& of, const char* child) {
    return count_layer(child, *of->named_children()[child], {b, s, h}, {b, s, h}, eb);
  };

  // RMSNorm on bf16 x, n elements: to float32 (2 bytes read and 4 written an element), the
  // square (4 + 4), the mean (4 read, 4 written a row), + eps and rsqrt (4 + 4 a row each),
  // x times that (4 + 4, and a row's 4), back to bf16 (4 + 2), times the weight (2 + 2): 36
  // bytes an element and 24 a row, where the fused kernel reads 2 and writes 2.
  const LayerWork norm = count(fused, "attn_norm"), eager_norm = count(eager, "attn_norm");
  const double n = rows * h;
  EXPECT_EQ(norm.kernels, 1);
  EXPECT_EQ(eager_norm.kernels, 8);
  EXPECT_DOUBLE_EQ(eager_norm.bytes - norm.bytes, 32 * n + 24 * rows);
  // FLOPs: one an element for the square, the mean, x · rsqrt and the weight, one a row for
  // + eps and rsqrt; fused counts 5 an element.
  EXPECT_DOUBLE_EQ(eager_norm.flops, 4 * n + 2 * rows);
  EXPECT_DOUBLE_EQ(norm.flops, 5 * n);

  // The rotation of q and k, n elements each: x·cos (1 read, 1 written), the negated half
  // (half of each), the cat (1 + 1), ·sin (1 + 1), the sum (2 + 1): 10 an element, where the
  // fused kernel reads and writes 2; four kernels more a tensor.
  const LayerWork attn = count(fused, "attn"), eager_attn = count(eager, "attn");
  const double rotated = rows * static_cast<double>(shape.heads + shape.kv_heads) * d;
  EXPECT_DOUBLE_EQ(eager_attn.bytes - attn.bytes, 8 * rotated * eb);
  EXPECT_DOUBLE_EQ(eager_attn.flops - attn.flops, 0.5 * rotated);
  EXPECT_EQ(eager_attn.kernels - attn.kernels, 2 * 4);
  EXPECT_DOUBLE_EQ(eager_attn.gemm_flops, attn.gemm_flops);
  EXPECT_EQ(eager_attn.gemms, attn.gemms);

  // The block counts its norms and attention as they are counted alone (count_composite's
  // path and count_layer's agree), the MLP unchanged.
  const LayerWork mlp = count(eager, "mlp");
  EXPECT_DOUBLE_EQ(mlp.bytes, count(fused, "mlp").bytes);
  const LayerWork whole = count_layer("block", *eager, {b, s, h}, {b, s, h}, eb);
  EXPECT_DOUBLE_EQ(whole.bytes, 2 * eager_norm.bytes + eager_attn.bytes + mlp.bytes +
                                    2 * 3 * rows * h * eb);
  EXPECT_EQ(whole.kernels, 2 * eager_norm.kernels + eager_attn.kernels + mlp.kernels + 2);
}
} // namespace
} // namespace meshsim
