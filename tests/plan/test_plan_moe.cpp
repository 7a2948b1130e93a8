// A plan's mixture of experts (plan/moe_routing.h): meta tensors have no values to route, so
// each expert gets a planned share of every layer's assignments. The shares round to whole
// assignments that add up; a recorded run's busiest step is read from routing.csv and
// rescaled to the plan's experts; and the routing planned is the work and the memory the
// plan's hottest rank gets: its experts' FLOPs are 6·H·F per row they ran, every rank of its
// ep group sending it its planned count.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "base/errors.h"
#include "models/layers/moe.h"
#include "models/presets.h"
#include "plan/moe_routing.h"
#include "plan/plan.h"

using namespace meshsim;

TEST(PlannedRouting, CountsAreWholeAndAddUp) {
  EXPECT_EQ(planned_counts({}, 4, 10), (std::vector<int64_t>{3, 3, 2, 2}));
  // 3.5, 1.75, 1.75: floors 3, 1, 1; the two left go to the largest remainders.
  EXPECT_EQ(planned_counts({0.5, 0.25, 0.25}, 3, 7), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_THROW(planned_counts({0.5, 0.5}, 3, 7), std::invalid_argument);
}

TEST(PlannedRouting, ImbalanceGivesExpertZeroItsShare) {
  const PlannedRouting r = planned_routing("balanced", 3, 8);
  ASSERT_EQ(r.shares.size(), 8u);
  EXPECT_DOUBLE_EQ(r.shares[0], 3.0 / 8);
  for (size_t e = 1; e < 8; ++e)
    EXPECT_DOUBLE_EQ(r.shares[e], (1 - 3.0 / 8) / 7);
  EXPECT_TRUE(planned_routing("balanced", 0, 8).shares.empty());
  EXPECT_THROW(planned_routing("balanced", 9, 8), std::invalid_argument);
  EXPECT_THROW(planned_routing("balanced", 0.5, 8), std::invalid_argument);
  EXPECT_THROW(planned_routing("/some/run", 2, 8), std::invalid_argument);
  EXPECT_THROW(planned_routing("/nonexistent/run", 0, 8), std::invalid_argument);
}

TEST(PlannedRouting, ARunsBusiestStepIsRescaledToThePlansExperts) {
  // Step 1 is balanced; step 2's busiest expert takes 5 of 8, 2.5 times the mean of 2.
  const std::string csv = "step,rank,layer,expert,routed,ran\n"
                          "1,0,1,0,1,1\n1,0,1,1,1,1\n1,0,1,2,1,\n1,0,1,3,1,\n"
                          "2,0,1,0,1,1\n2,0,1,1,1,1\n2,0,1,2,5,\n2,0,1,3,1,\n";
  const PlannedRouting same = routing_from_csv(csv, "routing.csv", 4);
  EXPECT_EQ(same.shares, (std::vector<double>{5.0 / 8, 1.0 / 8, 1.0 / 8, 1.0 / 8}));
  EXPECT_DOUBLE_EQ(same.hottest, 2.5);
  EXPECT_NE(same.description.find("step 2, layer 1"), std::string::npos) << same.description;
  // Twice the experts: each of the run's splits in two.
  const PlannedRouting twice = routing_from_csv(csv, "routing.csv", 8);
  const std::vector<double> expected{5.0 / 16, 5.0 / 16, 1.0 / 16, 1.0 / 16,
                                     1.0 / 16, 1.0 / 16, 1.0 / 16, 1.0 / 16};
  ASSERT_EQ(twice.shares.size(), expected.size());
  for (size_t e = 0; e < expected.size(); ++e)
    EXPECT_NEAR(twice.shares[e], expected[e], 1e-15) << e;
  // Half: the busiest two together.
  const PlannedRouting half = routing_from_csv(csv, "routing.csv", 2);
  EXPECT_NEAR(half.shares[0], 6.0 / 8, 1e-15);
  EXPECT_NEAR(half.shares[1], 2.0 / 8, 1e-15);
  for (const char* bad : {"step,rank\n1,0\n", "step,rank,layer,expert,routed,ran\n1,0,1,0,1\n",
                          "step,rank,layer,expert,routed,ran\n1,0,1,x,1,\n",
                          "step,rank,layer,expert,routed,ran\n1,0,1,-1,1,\n",
                          "step,rank,layer,expert,routed,ran\n",
                          "step,rank,layer,expert,routed,ran\n1,0,1,0,0,0\n"})
    EXPECT_THROW(routing_from_csv(bad, "routing.csv", 4), DataError) << bad;
}

namespace {

TrainConfig moe_plan_config() {
  TrainConfig c;
  c.model = "llama";
  c.shape.layers = 3;
  c.shape.hidden = 64;
  c.shape.heads = 4;
  c.shape.seq_len = 32;
  c.shape.vocab = 256;
  c.shape.moe.experts = 4;
  c.shape.moe.top_k = 2;
  c.shape.moe.ffn = 48;
  c.shape.moe.dense_layers = 1;
  c.data = "synthetic";
  c.device = "meta";
  c.gpus = 4;
  c.ep = 4;
  c.batch_size = 8;
  c.max_steps = kPlanSteps;
  c.progress = false;
  validate(c);
  return c;
}

struct Hottest {
  double forward_flops = 0;
  int64_t peak = 0;
};

Hottest plan_hottest(std::vector<double> shares) {
  TrainConfig c = moe_plan_config();
  c.shape.moe.planned_shares = std::move(shares);
  const Plan plan = make_plan(c, int64_t{1} << 40);
  Hottest h;
  for (const ComputeRecord& r : plan.recorders[0].compute)
    if (r.name == "forward")
      for (const LayerWork& w : r.layers)
        h.forward_flops += w.flops;
  h.peak = plan.ranks[0].stats.peak;
  return h;
}

} // namespace

TEST(PlanMoe, ThePlannedRoutingIsTheHottestRanksWorkAndMemory) {
  const TrainConfig c = moe_plan_config();
  const int64_t tokens = c.batch_size * c.shape.seq_len;  // per rank
  const int64_t assignments = tokens * c.shape.moe.top_k;
  // gate, up and down; SiLU (5 a feature), the product with up (1) and the weighted sum
  // back (2 a hidden feature)
  const double h = static_cast<double>(c.shape.hidden), f = static_cast<double>(c.shape.moe.ffn);
  const double per_row = 6.0 * h * f + 6.0 * f + 2.0 * h;
  const int64_t moe_layers = c.shape.layers - c.shape.moe.dense_layers;
  const Hottest balanced = plan_hottest({});
  double previous_peak = static_cast<double>(balanced.peak);
  for (double imbalance : {2.0, 4.0}) {
    const PlannedRouting r = planned_routing("balanced", imbalance, c.shape.moe.experts);
    const Hottest got = plan_hottest(r.shares);
    // Rank 0 holds expert 0 alone (4 experts over ep 4), and each of the 4 ranks sends it
    // its planned count.
    const int64_t rows = 4 * planned_counts(r.shares, 4, assignments)[0];
    const int64_t balanced_rows = 4 * planned_counts({}, 4, assignments)[0];
    const double expected =
        per_row * static_cast<double>(moe_layers) * static_cast<double>(rows - balanced_rows);
    EXPECT_NEAR(got.forward_flops - balanced.forward_flops, expected, 1e-9 * expected)
        << "imbalance " << imbalance;
    EXPECT_GT(static_cast<double>(got.peak), previous_peak) << "imbalance " << imbalance;
    previous_peak = static_cast<double>(got.peak);
  }
}

// A plan's dispatch sends each rank the tokens the planned routing reaches it with, once each
// (moe.h, planned_reach): top 2 of 4 experts, one a rank, so half the tokens reach a rank
// (1 - C(3,2)/C(4,2)). Forward exchanges, to each peer: the count of rows (one int64), the
// rows with their 2 weights (bf16), which expert each weight is for (2 int64 a row), and the
// rows back.
TEST(PlanMoe, ItsDispatchSendsEachRankTheTokensThatReachIt) {
  TrainConfig c = moe_plan_config();
  c.precision = "bf16";
  validate(c);
  const Plan plan = make_plan(c, int64_t{1} << 40);
  const int64_t rows = c.batch_size * c.shape.seq_len / 2, k = c.shape.moe.top_k;
  const int64_t hidden = c.shape.hidden;
  std::set<int64_t> sent;
  for (const CollectiveRecord& r : plan.recorders[0].collectives)
    if (r.op == "all_to_all")
      for (size_t peer = 1; peer < r.peer_bytes.size(); ++peer)
        sent.insert(r.peer_bytes[peer]);
  EXPECT_EQ(sent, (std::set<int64_t>{8, rows * k * 8, rows * hidden * 2, rows * (hidden + k) * 2}));
}

// On 2 nodes of 2 the plan's exchange has two levels: to the other node, the tokens that reach
// either of its 2 experts (1 - C(2,2)/C(4,2) = 5/6 of them); within the node, of the rows that
// arrived from both nodes, those that reach the member's one expert given that they reached
// the node's two (1/2 ÷ 5/6).
TEST(PlanMoe, AcrossNodesItsDispatchSendsOnceANodeThenOnceARank) {
  TrainConfig c = moe_plan_config();
  c.precision = "bf16";
  c.cluster = "2x2xh100";
  validate(c);
  const Plan plan = make_plan(c, int64_t{1} << 40);
  const int64_t k = c.shape.moe.top_k, hidden = c.shape.hidden;
  const int64_t to_node = std::llround(c.batch_size * c.shape.seq_len * 5.0 / 6);
  const int64_t within = std::llround(2 * to_node * 0.5 / (5.0 / 6));
  std::map<std::vector<int>, std::set<int64_t>> sent;
  for (const CollectiveRecord& r : plan.recorders[0].collectives)
    if (r.op == "all_to_all")
      for (size_t peer = 1; peer < r.peer_bytes.size(); ++peer)
        sent[r.group].insert(r.peer_bytes[peer]);
  const auto exchanged = [&](int64_t rows) {
    return std::set<int64_t>{8, rows * k * 8, rows * hidden * 2, rows * (hidden + k) * 2};
  };
  EXPECT_EQ(sent, (std::map<std::vector<int>, std::set<int64_t>>{
                      {{0, 2}, exchanged(to_node)}, {{0, 1}, exchanged(within)}}));
}

// With Megatron's alltoall dispatcher a plan sends each peer a row for every assignment the
// planned routing gives its experts (k·N/E each: top 2 of 4, one a rank), in one level even
// across nodes: the counts (one int64 an expert of the peer's) and the rows, each way.
TEST(PlanMoe, AllToAllSendsEachRankARowForEachOfItsAssignments) {
  TrainConfig c = moe_plan_config();
  c.precision = "bf16";
  c.cluster = "2x2xh100";
  c.moe_dispatch = "alltoall";
  validate(c);
  const Plan plan = make_plan(c, int64_t{1} << 40);
  const int64_t rows = c.batch_size * c.shape.seq_len * c.shape.moe.top_k / 4;
  std::map<std::vector<int>, std::set<int64_t>> sent;
  for (const CollectiveRecord& r : plan.recorders[0].collectives)
    if (r.op == "all_to_all")
      for (size_t peer = 1; peer < r.peer_bytes.size(); ++peer)
        sent[r.group].insert(r.peer_bytes[peer]);
  EXPECT_EQ(sent, (std::map<std::vector<int>, std::set<int64_t>>{
                      {{0, 1, 2, 3}, {8, rows * c.shape.hidden * 2}}}));
}

// The alltoall dispatcher's source runs two memory-bound kernels DeepEP's exchange does not
// (Megatron's permute and unpermute): its N tokens copied into a row an assignment (k N rows
// of H), and the rows that came back weighted and summed at the tokens (2 FLOPs an element of
// the k N rows). Rank 0's forward: 2 kernels and 2 k N H FLOPs more a MoE layer, the rest the
// same.
TEST(PlanMoe, AllToAllCountsTheSourcesPermuteAndUnpermute) {
  auto forward_work = [](const char* dispatch) {
    TrainConfig c = moe_plan_config();
    c.precision = "bf16";
    c.moe_dispatch = dispatch;
    validate(c);
    const Plan plan = make_plan(c, int64_t{1} << 40);
    LayerWork total;
    int64_t step = -1; // the first forward's
    for (const ComputeRecord& r : plan.recorders[0].compute)
      if (r.name == "forward" && (step < 0 || r.step == step))
        for (const LayerWork& w : r.layers) {
          step = r.step;
          total.kernels += w.kernels;
          total.flops += w.flops;
          total.gemm_flops += w.gemm_flops;
        }
    return total;
  };
  const LayerWork deepep = forward_work("deepep"), alltoall = forward_work("alltoall");
  const TrainConfig c = moe_plan_config();
  const int64_t moe_layers = c.shape.layers - c.shape.moe.dense_layers;
  const double sent = static_cast<double>(c.batch_size * c.shape.seq_len * c.shape.moe.top_k);
  EXPECT_EQ(alltoall.kernels - deepep.kernels, 2 * moe_layers);
  EXPECT_DOUBLE_EQ(alltoall.gemm_flops, deepep.gemm_flops);
  EXPECT_DOUBLE_EQ(alltoall.flops - deepep.flops,
                   static_cast<double>(moe_layers) * 2 * sent * static_cast<double>(c.shape.hidden));
}

// A plan of `preset` on `gpus` GPUs at tp 1 with pp and ep, bf16 and ZeRO 1, pp micro-batches
// of one sample, its last stage holding `last_stage_layers` blocks (0: as many as the others).
// The sequence is short: the model state does not depend on it, and the plan is quicker.
namespace plan_moe_test { // named: the unity build compiles this file with others

TrainConfig model_state_plan(const std::string& preset, int gpus, int pp, int ep,
                             int last_stage_layers) {
  const ModelPreset* p = find_preset(preset);
  if (!p)
    throw std::invalid_argument("no preset " + preset);
  TrainConfig c;
  c.model = p->family;
  c.preset = p->name;
  c.shape = p->shape;
  c.shape.seq_len = 256;
  c.data = "synthetic";
  c.device = "meta";
  c.gpus = gpus;
  c.pp = pp;
  c.ep = ep;
  c.zero = 1;
  c.last_stage_layers = last_stage_layers;
  c.precision = "bf16";
  c.micro_batches = pp;
  c.batch_size = pp;
  c.max_steps = kPlanSteps;
  c.progress = false;
  validate(c);
  return c;
}

} // namespace plan_moe_test

using plan_moe_test::model_state_plan;

// Mixtral 8x7B at tp 1, ep 8, pp 4 on 64 H100 (dp 16, so edp 2), bf16 with ZeRO 1: each GPU
// holds its stage's dense parameters whole and 1/8 of its routed experts, in bf16, with bf16
// gradients of both; the fp32 master weights and Adam's two moments (12 bytes a parameter)
// of the dense parameters sharded over dp × cp = 16 and of its experts over edp = 2. Every
// count here divides its group, so no flat buffer is padded: the bytes are the formula's.
TEST(PlanMoe, MixtralModelStateIsTheFormulasOnEveryStage) {
  const TrainConfig c = model_state_plan("mixtral-8x7b", 64, 4, 8, 0);
  const TransformerShape& s = c.shape;
  const int64_t H = s.hidden, heads = s.heads, kv = preset_kv_heads(s), d = H / heads;
  const int64_t E = s.moe.experts, F = s.moe.ffn, V = s.vocab, per_stage = s.layers / c.pp;
  const int64_t attention = H * heads * d + 2 * H * kv * d + heads * d * H;
  const int64_t dense_layer = attention + 2 * H /* norms */ + E * H /* router */;
  const int64_t expert_layer = 3 * E * H * F;
  const int64_t dp = 16, edp = dp / c.ep;
  const Plan plan = make_plan(c, int64_t{1} << 40);
  ASSERT_EQ(plan.ranks.size(), 4u);
  for (const PlannedRank& r : plan.ranks) {
    const int stage = r.coord.pp;
    int64_t dense = per_stage * dense_layer;
    if (stage == 0)
      dense += V * H; // the embedding
    if (stage == c.pp - 1)
      dense += H + V * H; // the final norm and the head
    const int64_t experts = per_stage * expert_layer / c.ep;
    const int64_t held = dense + experts;
    const int64_t expected = 2 * held + 2 * held + 12 * (dense / dp + experts / edp);
    EXPECT_EQ(r.model_state_bytes, expected) << "stage " << stage;
    std::cout << "mixtral-8x7b stage " << stage << ": model state " << r.model_state_bytes
              << " bytes (" << held << " parameters held)\n";
  }
}

// DeepSeek-V3 at pp 16, ep 64, ZeRO 1 on 2,048 H800 (dp 128, so edp 2), bf16: 61 layers as 15
// stages of 4 and a last stage of 1 (--last-stage-layers 1: it holds the head). Each GPU holds
// its layers' multi-head latent attention, norms, dense MLPs (the first three layers), routers
// and shared experts whole and 1/64 of the routed experts, in bf16 with bf16 gradients; the fp32
// master weights and Adam's two moments (12 bytes a parameter) of the dense parameters are
// sharded over dp × cp = 128 and of the experts over edp = 2. A count that does not divide its
// group is padded up to the next multiple (ZeRO's flat buffer), as the formula says.
TEST(PlanMoe, DeepSeekV3ModelStateIsTheFormulasOnEveryStage) {
  const TrainConfig c = model_state_plan("deepseek-v3", 2048, 16, 64, 1);
  const TransformerShape& s = c.shape;
  const LatentShape& l = s.latent;
  const int64_t H = s.hidden, n = s.heads, V = s.vocab, E = s.moe.experts, F = s.moe.ffn;
  const int64_t attention = H * l.q_rank + l.q_rank + l.q_rank * n * (l.nope_dim + l.rope_dim) +
                            H * (l.kv_rank + l.rope_dim) + l.kv_rank +
                            l.kv_rank * n * (l.nope_dim + l.v_dim) + n * l.v_dim * H;
  const int64_t dense_mlp = 3 * H * s.ffn_hidden;
  const int64_t router_and_shared = E * H + 3 * H * s.moe.shared_ffn;
  const int64_t expert_layer = 3 * E * H * F;
  const int64_t dp = 128, edp = dp / c.ep;
  const auto padded = [](int64_t count, int64_t group) { return (count + group - 1) / group; };
  const Plan plan = make_plan(c, int64_t{1} << 40);
  ASSERT_EQ(plan.ranks.size(), 16u);
  for (const PlannedRank& r : plan.ranks) {
    const int64_t stage = r.coord.pp;
    const int64_t first = stage * 4, count = stage == c.pp - 1 ? 1 : 4;
    int64_t dense = 0, experts = 0;
    for (int64_t layer = first; layer < first + count; ++layer) {
      dense += attention + 2 * H; // and the two norms
      if (layer < s.moe.dense_layers) {
        dense += dense_mlp;
      } else {
        dense += router_and_shared;
        experts += expert_layer / c.ep;
      }
    }
    if (stage == 0)
      dense += V * H; // the embedding
    if (stage == c.pp - 1)
      dense += H + V * H; // the final norm and the head
    const int64_t held = dense + experts;
    const int64_t expected = 2 * held + 2 * held + 12 * (padded(dense, dp) + padded(experts, edp));
    EXPECT_EQ(r.model_state_bytes, expected) << "stage " << stage;
    std::cout << "deepseek-v3 stage " << stage << ": model state " << r.model_state_bytes
              << " bytes (" << held << " parameters held)\n";
  }
}
