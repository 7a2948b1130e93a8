// With --dropout, a plan of Korthikanti et al. 2022's 22B GPT (Table 3: h 6144, 64 heads,
// s 2048, tensor parallel 8, one sequence per micro-batch, bf16) keeps per layer the bytes of
// their five formulas: what the GPT without dropout kept (tests/plan/test_plan.cpp) plus the
// two hidden dropouts' 1-byte masks (sbh each, or sbh/t each under sequence parallelism) and,
// without selective recompute, the attention dropout's 1-byte mask and 2-byte output
// (3as²b, or 3as²b/t): exactly the paper's terms plus what the paper leaves out, the causal
// mask's s² bool and the LayerNorms' mean and rstd, 8sb (8sb/t under sequence parallelism).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>

#include "memory/allocator.h"
#include "models/presets.h"
#include "plan/plan.h"

namespace meshsim {
namespace {

// Activation bytes of one layer of the 22B GPT with dropout 0.1: the planned peak with
// `layers` + 1 layers less the peak with `layers`. With a real vocabulary the end of backward
// holds the embedding's [V, h] gradients, so a layout with small layers (a 1/8 share) needs
// enough of them for the peak to come at the loss, where every layer's activations are held
// (tests/plan/test_plan.cpp plans the paper's models with 32).
int64_t dropout_bytes_per_layer(int tp, bool sequence_parallel, const std::string& recompute,
                                int64_t layers, const std::string& attention = "eager",
                                double dropout = 0.1) {
  const ModelPreset* preset = find_preset("gpt-22b");
  EXPECT_NE(preset, nullptr);
  auto peak = [&](int64_t n) {
    TrainConfig c;
    c.model = "gpt";
    c.data = "synthetic";
    c.shape = preset->shape;
    c.shape.layers = n;
    c.gpus = tp;
    c.tp = tp;
    c.sequence_parallel = sequence_parallel;
    c.recompute = recompute;
    c.precision = "bf16";
    c.batch_size = 1;
    c.dropout = dropout;
    c.attention = attention; // Korthikanti et al.'s formulas are the eager core's
    validate(c);
    const Plan plan = make_plan(c, int64_t{1} << 50);
    return plan.ranks.front()
        .stats.peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
  };
  return peak(layers + 1) - peak(layers);
}

TEST(PlanDropout, TwentyTwoBillionLayerKeepsKorthikantisFiveFormulas) {
  const ModelPreset* preset = find_preset("gpt-22b");
  ASSERT_NE(preset, nullptr);
  const int64_t s = preset->shape.seq_len, h = preset->shape.hidden, a = preset->shape.heads;
  const int64_t b = 1, t = 8, sbh = s * b * h, as2b = a * s * s * b;
  ASSERT_EQ(s, 2048);
  struct Row {
    const char* layout;
    int tp;
    bool sp;
    const char* recompute;
    double paper;   // Korthikanti et al.'s bytes per layer
    int64_t exact;  // the paper's terms in integers, plus the causal mask and the statistics
  };
  const double d = static_cast<double>(sbh);
  const Row rows[] = {
      {"no recompute", 1, false, "none", 34 * d + 5.0 * as2b,
       34 * sbh + 5 * as2b + s * s + 8 * s * b},
      {"tensor parallel", t, false, "none", d * (10 + 24.0 / t + 5.0 * a * s / (h * t)),
       10 * sbh + 24 * sbh / t + 5 * as2b / t + s * s + 8 * s * b},
      {"+ sequence parallel", t, true, "none", d / t * (34 + 5.0 * a * s / h),
       34 * sbh / t + 5 * as2b / t + s * s + 8 * s * b / t},
      {"+ selective recompute (tp)", t, false, "selective", d * (10 + 24.0 / t),
       10 * sbh + 24 * sbh / t + 8 * s * b},
      {"sp + selective", t, true, "selective", d * 34 / t, 34 * sbh / t + 8 * s * b / t},
  };
  for (const Row& r : rows) {
    const int64_t got = dropout_bytes_per_layer(r.tp, r.sp, r.recompute, r.tp == 1 ? 2 : 32);
    const double ratio = static_cast<double>(got) / r.paper;
    std::cout << "gpt-22b, dropout 0.1, " << r.layout << ": " << got << " B per layer, paper "
              << r.paper << " (ratio " << ratio << ")\n";
    EXPECT_EQ(got, r.exact) << r.layout;
    EXPECT_LT(std::abs(ratio - 1), 0.02) << r.layout;
  }
}

// The fused core with dropout keeps nothing more of attention than without it: its mask is
// regenerated tile by tile (a transient), so a layer keeps only the two hidden dropouts'
// 1-byte masks more, 2sbh, or 2sbh/t under sequence parallelism (each member masks its part
// of the sequence).
TEST(PlanDropout, FusedCoreKeepsOnlyTheHiddenMasksMore) {
  const ModelPreset* preset = find_preset("gpt-22b");
  ASSERT_NE(preset, nullptr);
  const int64_t s = preset->shape.seq_len, h = preset->shape.hidden, sbh = s * h, t = 8;
  for (bool sp : {false, true}) {
    const int64_t with = dropout_bytes_per_layer(t, sp, "none", 32, "fused", 0.1);
    const int64_t without = dropout_bytes_per_layer(t, sp, "none", 32, "fused", 0);
    std::cout << "gpt-22b, fused, tp 8" << (sp ? " sp" : "") << ": " << with
              << " B per layer with dropout 0.1, " << without << " without\n";
    EXPECT_EQ(with - without, sp ? 2 * sbh / t : 2 * sbh) << (sp ? "sp" : "no sp");
  }
}

} // namespace
} // namespace meshsim
