// Recomputation costs FLOPs: a backward runs again the forward work its layer recomputes, the
// predicted step counts it (tflops_per_gpu), and MFU leaves it out (the model's FLOPs).
#include <gtest/gtest.h>

#include <string>

#include "cost/hardware.h"
#include "plan/plan.h"

using namespace meshsim;

namespace {

// The tiny GPT with `layers` blocks, one sequence of `seq` tokens per GPU, on `gpus` GPUs of
// one node with ZeRO `zero`, with the eager attention core unless `attention` says otherwise.
PlanFigures planned(const char* recompute, int gpus = 1, int zero = 0,
                    const char* attention = "eager") {
  TrainConfig c;
  c.attention = attention;
  c.model = "gpt";
  c.data = "synthetic";
  c.gpus = gpus;
  c.zero = zero;
  c.recompute = recompute;
  c.batch_size = 1;
  c.shape.layers = 3;
  c.shape.seq_len = 128;
  c.progress = false;
  validate(c);
  return plan_on(c, parse_cluster_spec(std::to_string(gpus) + "xa100-80"));
}

} // namespace

// Selective recompute runs the attention core's QKᵀ and attention over V again: 4·b·s²·h per
// block per GPU, the same FLOPs the forward counts for it.
TEST(PlanFlops, SelectiveRecomputeAddsEachAttentionCoreOnce) {
  for (int zero : {0, 3}) {
    const int gpus = zero == 0 ? 1 : 2;
    const PlanFigures none = planned("none", gpus, zero), selective = planned("selective", gpus, zero);
    const double b = 1, s = 128, h = 64, layers = 3;
    EXPECT_DOUBLE_EQ(selective.flops - none.flops, gpus * layers * 4 * b * s * s * h) << zero;
    EXPECT_DOUBLE_EQ(selective.model_flops, none.model_flops) << zero;
  }
}

// Full recompute runs every block's forward again: a block's forward is a third of its forward
// and backward (backward = 2× forward for its matmuls and attention, 1× for the rest, so not
// exactly a third), and the model's FLOPs do not change.
TEST(PlanFlops, FullRecomputeAddsEveryBlocksForwardOnceAndMfuLeavesItOut) {
  for (int zero : {0, 3}) {
    const int gpus = zero == 0 ? 1 : 2;
    const PlanFigures none = planned("none", gpus, zero), full = planned("full", gpus, zero);
    EXPECT_DOUBLE_EQ(full.model_flops, none.model_flops) << zero;
    const double recomputed = full.flops - none.flops;
    EXPECT_GT(recomputed, 0.25 * none.flops) << zero; // the blocks are most of the model
    EXPECT_LT(recomputed, none.flops / 3) << zero;
    EXPECT_NEAR(full.mfu / full.tflops_per_gpu,
                none.model_flops / full.flops / (full.peak_flops / 1e12), 1e-12)
        << zero;
  }
}

// The fused core's backward computes S = QKᵀ again before its four GEMMs: 2·b·s²·h more per
// block per GPU than the eager core's backward, counted as recomputation (MFU leaves it out).
// Selective recompute has nothing to drop from a fused core and adds nothing; full recompute
// adds the blocks' forward, as with the eager core.
TEST(PlanFlops, FusedAttentionRecomputesTheScoresInBackward) {
  for (int zero : {0, 3}) {
    const int gpus = zero == 0 ? 1 : 2;
    const double b = 1, s = 128, h = 64, layers = 3;
    const PlanFigures eager = planned("none", gpus, zero, "eager");
    const PlanFigures fused = planned("none", gpus, zero, "fused");
    EXPECT_DOUBLE_EQ(fused.flops - eager.flops, gpus * layers * 2 * b * s * s * h) << zero;
    EXPECT_DOUBLE_EQ(fused.model_flops, eager.model_flops) << zero;
    EXPECT_DOUBLE_EQ(planned("selective", gpus, zero, "fused").flops, fused.flops) << zero;
    EXPECT_DOUBLE_EQ(planned("full", gpus, zero, "fused").flops - fused.flops,
                     planned("full", gpus, zero, "eager").flops - eager.flops)
        << zero;
  }
}

// Op-level recompute (torchtitan's) runs each block's forward again but the matmuls it keeps
// (q, v, fc, proj) and a fused attention core: GPT's block runs again its two LayerNorms
// (5·b·s·h each), its two residual adds (b·s·h each), GELU (8 FLOPs on each of fc's b·s·4h
// outputs), k's and the output projection (h → h with a bias, 2·b·s·h² + b·s·h each) and,
// with the eager core, QKᵀ and attention over V (4·b·s²·h).
TEST(PlanFlops, OpRecomputeRunsTheBlockAgainButItsKeptMatmuls) {
  for (const char* attention : {"eager", "fused"})
    for (int zero : {0, 3}) {
      const int gpus = zero == 0 ? 1 : 2;
      const PlanFigures none = planned("none", gpus, zero, attention);
      const PlanFigures op = planned("op", gpus, zero, attention);
      const double b = 1, s = 128, h = 64, layers = 3;
      const double norms = 2 * 5 * b * s * h, projection = 2 * b * s * h * h + b * s * h;
      const double adds = 2 * b * s * h, gelu = 8 * b * s * 4 * h;
      const double core = std::string(attention) == "eager" ? 4 * b * s * s * h : 0;
      EXPECT_DOUBLE_EQ(op.flops - none.flops,
                       gpus * layers * (norms + adds + gelu + 2 * projection + core))
          << attention << " zero " << zero;
      EXPECT_DOUBLE_EQ(op.model_flops, none.model_flops) << attention << " zero " << zero;
    }
}
