// A Llama layer's activation bytes in a plan at the published sizes (the peak of the
// activations with one more layer less the peak without it), against the formula of
// docs/planning.md ("The Llama's layer"). In bf16 with the fused core, per layer:
//
//   32sbh + 8sbf + 4asb + 8sb + 8sd + 8s
//
// s tokens, b samples, h hidden, a heads of d dimensions, f the SwiGLU's inner width, the
// kv heads g (1 < g ≤ a) repeated to a heads:
//  - each RMSNorm, in float32: its float32 input (kept for the square's and the product's
//    backward), the square (kept by the mean in LibTorch 1.13; 2.x keeps only its size),
//    1/rms (4sb), the normalized bf16 tensor (kept by the weight's product) and the product
//    (kept by the projections that read it): 12sbh + 4sb, twice (8sbh less under 2.x);
//  - attention: q after rotary, K and V repeated to a heads (what the fused core keeps), the
//    core's output and its float32 log-sum-exp (4asb), the int64 positions (8s), and rotary's
//    cos and sin for q and for k (4 × 2sd; the products keep only these, which have no
//    gradient): 8sbh + 4asb + 8s + 8sd;
//  - SwiGLU: the gate's and the up projection's outputs, silu(gate) and the product the down
//    projection reads: 4 × 2sbf.
// With full recompute a layer keeps its input, 2sbh, cut by cp (its s/C tokens) and by tp
// under sequence parallelism.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include <torch/version.h>

#include "memory/category.h"
#include "models/presets.h"
#include "plan/plan.h"

using namespace meshsim;

namespace {

struct LlamaPlan {
  std::string preset;
  int64_t seq_len = 8192, batch = 1;
  int tp = 1, cp = 1;
  bool sequence_parallel = false;
  std::string recompute = "none";
  std::string cp_comm = "allgather";
};

// The activation peak of the first stage with `layers` layers.
int64_t activation_peak(const LlamaPlan& p, int64_t layers) {
  TrainConfig c;
  c.model = "llama";
  c.shape = find_preset(p.preset)->shape;
  c.shape.layers = layers;
  c.shape.seq_len = p.seq_len;
  c.data = "synthetic";
  c.precision = "bf16";
  c.attention = "fused";
  c.recompute = p.recompute;
  c.gpus = p.tp * p.cp;
  c.tp = p.tp;
  c.cp = p.cp;
  c.cp_comm = p.cp_comm;
  c.sequence_parallel = p.sequence_parallel;
  c.batch_size = p.batch;
  c.progress = false;
  validate(c);
  const Plan plan = make_plan(c, kPlanCapacity);
  return plan.ranks.front().stats.peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
}

int64_t per_layer(const LlamaPlan& p) {
  return activation_peak(p, 3) - activation_peak(p, 2);
}

// The formula above for one GPU (no tp, no cp).
int64_t llama_layer_bytes(const std::string& preset, int64_t s, int64_t b) {
  const TransformerShape& shape = find_preset(preset)->shape;
  const int64_t h = shape.hidden, a = shape.heads, d = h / a;
  const int64_t f = preset_ffn_hidden("llama", shape);
  const int64_t norms_square = TORCH_VERSION_MAJOR >= 2 ? 0 : 8 * s * b * h;
  return 24 * s * b * h + norms_square + 8 * s * b * f + 4 * a * s * b + 8 * s * b + 8 * s * d +
         8 * s;
}

} // namespace

// Llama 3 8B at 8K tokens: the plan of docs/planning.md without its ZeRO 3 (which changes
// no activation).
TEST(PlanLlamaActivations, Llama3_8bAt8kTokensIsTheFormula) {
  const int64_t got = per_layer({"llama3-8b", 8192});
  EXPECT_EQ(got, llama_layer_bytes("llama3-8b", 8192, 1));
  std::cout << "llama3-8b, 8,192 tokens: " << got << " B per layer\n";
}

// Llama 3 8B at 8K tokens, 2 sequences, with op-level recompute (torchtitan's run): a layer
// keeps its input, q's, v's, gate's and down's outputs and the fused core's output, bf16,
// 2sb(4h + h_kv + f), and the core's float32 log-sum-exp, 4asb: 1.04 GB against 4.04 GB
// without recompute.
TEST(PlanLlamaActivations, Llama3_8bAt8kTokensWithOpRecomputeKeepsEveryOtherMatmul) {
  const TransformerShape& shape = find_preset("llama3-8b")->shape;
  const int64_t s = 8192, b = 2, h = shape.hidden, a = shape.heads;
  const int64_t kv = shape.kv_heads * (h / a), f = preset_ffn_hidden("llama", shape);
  LlamaPlan p{"llama3-8b", s, b};
  p.recompute = "op";
  const int64_t got = per_layer(p);
  EXPECT_EQ(got, 2 * s * b * (4 * h + kv + f) + 4 * a * s * b);
  std::cout << "llama3-8b, 8,192 tokens × 2, op recompute: " << got << " B per layer; none: "
            << llama_layer_bytes("llama3-8b", s, b) << " B\n";
}

// Llama 3 8B at 128K tokens over cp 8 with full recompute, both exchanges: each layer keeps
// its input for its 16,384 tokens.
TEST(PlanLlamaActivations, Llama3_8bAt128kTokensOverCp8KeepsEachLayersInput) {
  const int64_t h = find_preset("llama3-8b")->shape.hidden;
  for (const char* comm : {"ring", "allgather"}) {
    LlamaPlan p{"llama3-8b", 131072, 1, 1, 8};
    p.recompute = "full";
    p.cp_comm = comm;
    EXPECT_EQ(per_layer(p), 2 * (131072 / 8) * h) << comm;
  }
}

// Llama 3 405B at 128K tokens over tp 8 with sequence parallelism and cp 16 (its pp 16 runs
// the same layers per stage): with full recompute a layer keeps 2sbh/(C·t).
TEST(PlanLlamaActivations, Llama3_405bAt128kTokensOverTp8Cp16KeepsItsPartOfTheInput) {
  const int64_t h = find_preset("llama3-405b")->shape.hidden;
  LlamaPlan p{"llama3-405b", 131072, 1, 8, 16, true};
  p.recompute = "full";
  EXPECT_EQ(per_layer(p), 2 * 131072 * h / (16 * 8));
}
