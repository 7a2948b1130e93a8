// plan --search: the estimate of a layout from plans with 1 and 2 blocks per stage and 1 and
// 2 micro-batches, held against the full plan; and the search's ranking and rejections.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "cost/hardware.h"
#include "memory/category.h"
#include "plan/plan.h"
#include "plan/estimate.h"
#include "plan/search.h"
#include "plan/search_space.h"

using namespace meshsim;

// Outside the anonymous namespace: the tests derive from fixtures of it.
struct SearchCase {
  const char* name;
  int gpus, tp, pp, zero;
  int64_t micro_batch_size;
  int micro_batches;
  const char* recompute;
  bool sequence_parallel;
  const char* precision;
  const char* attention = "fused"; // --attention
};

namespace {

// Narayanan et al.'s 1.7B GPT (h 2304, 24 heads, s 2048, V 51200), 8 blocks deep, in the
// layout of `l`, validated: real proportions (on the meta device its size costs nothing),
// where the blocks, not fixed latencies, make the step.
TrainConfig config_of(const SearchCase& l) {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.preset = "gpt-1.7b";
  ModelFlagsGiven given;
  given.preset = true;
  apply_preset(c, given);
  c.shape.layers = 8;
  c.shape.tie_head = false;
  c.precision = l.precision;
  c.gpus = l.gpus;
  c.tp = l.tp;
  c.pp = l.pp;
  c.zero = l.zero;
  c.micro_batch_size = l.micro_batch_size;
  c.global_batch_size = l.micro_batch_size * l.micro_batches * (l.gpus / (l.tp * l.pp));
  c.recompute = l.recompute;
  c.sequence_parallel = l.sequence_parallel;
  c.attention = l.attention;
  c.progress = false;
  validate(c);
  return c;
}

// The full plan of `l` and its estimate, on two nodes of A100s.
struct Both {
  PlanFigures full, estimate;
};
Both plan_and_estimate(const SearchCase& l) {
  const TrainConfig c = config_of(l);
  const ClusterSpec cluster = parse_cluster_spec(fmt::format("2x{}xa100-80", l.gpus / 2));
  Both both{plan_on(c, cluster), estimate_layout(c, cluster)};
  EXPECT_EQ(both.estimate.stages.size(), both.full.stages.size()) << l.name;
  return both;
}

} // namespace

class SearchEstimate : public ::testing::TestWithParam<SearchCase> {};
class SearchEstimateApproximate : public ::testing::TestWithParam<SearchCase> {};

TEST_P(SearchEstimate, EqualsTheFullPlan) {
  const SearchCase l = GetParam();
  const auto [full, estimate] = plan_and_estimate(l);
  for (size_t i = 0; i < full.stages.size(); ++i) {
    EXPECT_EQ(estimate.stages[i].peak_bytes, full.stages[i].peak_bytes) << l.name << " stage " << i;
    EXPECT_EQ(estimate.stages[i].model_state_bytes, full.stages[i].model_state_bytes) << l.name;
    for (int k = 0; k < kNumCategories; ++k)
      EXPECT_EQ(estimate.stages[i].peak_by_category[k], full.stages[i].peak_by_category[k])
          << l.name << " stage " << i << " " << category_name(static_cast<MemoryCategory>(k));
  }
  EXPECT_DOUBLE_EQ(estimate.flops, full.flops) << l.name;
  EXPECT_DOUBLE_EQ(estimate.model_flops, full.model_flops) << l.name;
  // The step is printed, not compared: the replay orders what the meta run's threads did by
  // the moments they did it, so on a loaded machine two plans of one configuration predict
  // steps up to a few percent apart (seen: 2.3 % with tests running beside it). On a quiet
  // machine the estimate was within 0.15 % on every layout here; bench/plan.sh prints the
  // estimate against the full plan for the search's best layouts.
  std::cout << l.name << ": step " << estimate.step_seconds << " s estimated, " << full.step_seconds
            << " s planned (" << 100 * (estimate.step_seconds / full.step_seconds - 1) << " %)\n";
  EXPECT_EQ(estimate.tokens_per_step, full.tokens_per_step) << l.name;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SearchEstimate,
    ::testing::Values(SearchCase{"zero3", 4, 1, 1, 3, 1, 3, "full", false, "bf16"},
                      SearchCase{"pp2_zero1", 4, 1, 2, 1, 1, 8, "none", false, "fp32", "eager"},
                      SearchCase{"tp2_pp2_sp_selective", 8, 2, 2, 1, 1, 6, "selective", true, "bf16",
                                 "eager"},
                      SearchCase{"tp2_dp2", 4, 2, 1, 0, 4, 2, "selective", false, "fp32"}),
    [](const auto& info) { return std::string(info.param.name); });

// Where the estimate is not exact, and why (docs/planning.md): DDP's gradient buckets group
// parameters by a byte cap, so a model of 1 or 2 blocks buckets differently from one of 8
// (its communication buffers are not linear in blocks); and a 4-stage 1F1B with full recompute
// peaks in stage 0 in a phase that one and two micro-batches do not reach. The model state and
// the FLOPs are still exact (linear in blocks); the peaks are printed. And a 2-stage pipeline
// under the fused core: its stage 0 (two micro-batches held at once under 1F1B) was estimated
// 1.3 % low in fp32 (its activations by 93.9 MB) on the 1.7B GPT, and with tp 2 and sequence
// parallelism in bf16 its peak exactly but its activations' own peak 40.1 MB low; the cause
// is not found yet (docs/planning.md).
TEST_P(SearchEstimateApproximate, ModelStateAndFlopsAreExactThePeaksPrinted) {
  const SearchCase l = GetParam();
  const auto [full, estimate] = plan_and_estimate(l);
  for (size_t i = 0; i < full.stages.size(); ++i) {
    EXPECT_EQ(estimate.stages[i].model_state_bytes, full.stages[i].model_state_bytes) << l.name;
    std::cout << l.name << " stage " << i << ": peak " << estimate.stages[i].peak_bytes
              << " B estimated, " << full.stages[i].peak_bytes << " B planned ("
              << 100.0 * (static_cast<double>(estimate.stages[i].peak_bytes) /
                              static_cast<double>(full.stages[i].peak_bytes) -
                          1)
              << " %)\n";
  }
  EXPECT_DOUBLE_EQ(estimate.flops, full.flops) << l.name;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SearchEstimateApproximate,
    ::testing::Values(SearchCase{"dp4", 4, 1, 1, 0, 2, 4, "none", false, "fp32"},
                      SearchCase{"pp4_full", 4, 1, 4, 0, 2, 8, "full", false, "bf16"},
                      SearchCase{"pp2_zero1_fused", 4, 1, 2, 1, 1, 8, "none", false, "fp32"},
                      SearchCase{"tp2_pp2_sp_fused", 8, 2, 2, 1, 1, 6, "none", true, "bf16"}),
    [](const auto& info) { return std::string(info.param.name); });

// A bf16 Llama of `preset` on synthetic data at `seq_len` tokens, its layout still to set.
static TrainConfig llama_preset(const char* preset, int64_t seq_len) {
  TrainConfig c;
  c.model = "llama";
  c.data = "synthetic";
  c.preset = preset;
  ModelFlagsGiven given;
  given.preset = true;
  apply_preset(c, given);
  c.shape.seq_len = seq_len;
  c.precision = "bf16";
  c.progress = false;
  return c;
}

// A backward whose peak moves: Llama 3 70B's blocks at 32K tokens, tp 2 × cp 8 (ring) with
// sequence parallelism and ZeRO 2. With 1 or 2 blocks a stage's backward peaks at its end,
// where the replicated embedding's gradient (128,256 × 8,192) outweighs the blocks'
// activations; with more, at its start, with every block's activations. A line through the
// small plans follows the end, so the estimate is held to at least the activations' peak
// with the model state beside them (estimate.cpp), which is the full plan's peak but for
// what the other categories (communication, other) hold at that moment.
TEST(SearchEstimateBound, ABackwardWhosePeakMovesWithTheBlocksIsNotCarriedLow) {
  TrainConfig c = llama_preset("llama3-70b", 32768);
  c.shape.layers = 8;
  c.gpus = 32;
  c.tp = 2;
  c.cp = 8;
  c.cp_comm = "ring";
  c.zero = 2;
  c.sequence_parallel = true;
  c.micro_batch_size = 1;
  c.global_batch_size = 2;
  validate(c);
  const ClusterSpec cluster = parse_cluster_spec("4x8xh100");
  const PlanFigures full = plan_on(c, cluster), estimate = estimate_layout(c, cluster);
  ASSERT_EQ(full.stages.size(), 1u);
  const StageFigures& f = full.stages[0];
  const auto at = [&](MemoryCategory k) { return f.peak_by_category[static_cast<size_t>(k)]; };
  const int64_t elsewhere = at(MemoryCategory::Communication) + at(MemoryCategory::Other);
  std::cout << "peak " << estimate.stages[0].peak_bytes << " B estimated, " << f.peak_bytes
            << " B planned\n";
  EXPECT_GE(estimate.stages[0].peak_bytes, f.peak_bytes - elsewhere);
  EXPECT_EQ(estimate.stages[0].model_state_bytes, f.model_state_bytes);
}

// Within a family and micro-batch size the search takes the least sharding whose full
// recompute fits, then the lightest recompute that fits there, and, where none does, at more
// sharding: Llama 3 8B on 8 H100s (tp 2 with sequence parallelism, micro-batches of 2
// sequences of 4,096) fits full recompute at ZeRO 0 but no recompute only at ZeRO 1, which is
// faster (recomputing the forward costs more than sharding the optimizer state).
TEST(SearchChoice, ALighterRecomputeWithMoreShardingIsWeighedAgainstFullRecompute) {
  TrainConfig base = llama_preset("llama3-8b", 4096);
  base.gpus = 8;
  base.global_batch_size = 32;
  const ClusterSpec cluster = parse_cluster_spec("8xh100");
  SearchOptions options;
  options.top = 1000;
  options.confirm = 0;
  const SearchResult result = search_layouts(base, cluster, options);
  const auto found = std::find_if(result.best.begin(), result.best.end(), [](const Layout& l) {
    return l.config.tp == 2 && l.config.pp == 1 && l.config.cp == 1 &&
           l.config.sequence_parallel && micro_batch_size_of(l.config) == 2;
  });
  ASSERT_NE(found, result.best.end());
  TrainConfig light = found->config;
  light.zero = 1;
  light.dp_shard = 0;
  light.recompute = "none";
  validate(light);
  const PlanFigures figures = estimate_layout(light, cluster);
  ASSERT_TRUE(figures.fits) << search::describe(light);
  EXPECT_GE(found->figures.tokens_per_s_per_gpu, figures.tokens_per_s_per_gpu)
      << "chose " << search::describe(found->config) << " over " << search::describe(light);
}

// --no-loss-upcast runs only where the loss takes whole logits: the search's families are
// those of tp 1 (every cp and pp it would try anyway), and with the upcast tp goes up to the
// node's 8.
TEST(SearchSpace, WithoutTheLossUpcastEveryFamilyIsTp1) {
  TrainConfig c = llama_preset("llama3-8b", 8192);
  const ClusterSpec cluster = parse_cluster_spec("2x8xh100");
  int largest = 0;
  for (const search::FamilyShape& f : search::family_shapes(c, cluster))
    largest = std::max(largest, f.tp);
  EXPECT_EQ(largest, 8);
  c.loss_upcast = false;
  const std::vector<search::FamilyShape> shapes = search::family_shapes(c, cluster);
  ASSERT_FALSE(shapes.empty());
  for (const search::FamilyShape& f : shapes)
    EXPECT_EQ(f.tp, 1) << search::describe(f);
}
