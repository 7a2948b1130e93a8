// Expert parallelism (parallel/expert/expert_parallel.h): a mixture-of-experts Llama (4
// experts, top 2, shared experts, a dense first layer, the balancing loss on) trained with its
// routed experts split over ep ranks, against one GPU: float64, 10 steps of SGD with
// momentum, dropless, so the routing is the same on both sides and only the order of the
// gradient sums differs: losses and final parameters within kFloat64Tolerance
// (strategy_harness.h). Layouts: ep 2 and 4 (all of dp), ep 2 × tp 2, ep 2 × pp 2 × dp 2 and
// dp 4 with ZeRO 1 and ZeRO 3 (experts sharded over edp, the dense parameters over dp), cp 2 × ep 2
// (the balancing loss over whole sequences), ep 2 with HSDP; ep 4 over two nodes (the
// exchange in two levels); and with Megatron's alltoall dispatcher (--moe-dispatch alltoall).
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "models/layers/moe.h"
#include "parallel/expert/expert_parallel.h"
#include "moe_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

struct EpLayout {
  const char* name;
  int world, ep, tp, pp, cp, zero, micro_batches, dp_shard;
  int node_size = 0; // GPUs a node: 2 puts ep 4 on two nodes, exchanged in two levels
  const char* dispatch = "deepep"; // --moe-dispatch
};

// `base` trained in layout `l` against `ref` (it on one GPU): every step's loss and every final
// parameter within kFloat64Tolerance; prints the worst parameter error after `what`.
void expect_layout_trains_as_one_gpu(const StrategyOptions& base, const HarnessRun& ref,
                                     const EpLayout& l, const std::string& what) {
  StrategyOptions o = base;
  o.ep = l.ep;
  o.tp = l.tp;
  o.pp = l.pp;
  o.cp = l.cp;
  o.zero = l.zero;
  o.micro_batches = l.micro_batches;
  o.dp_shard = l.dp_shard;
  o.node_size = l.node_size;
  o.moe_dispatch = l.dispatch;
  const HarnessRun got = run_tiny_moe(l.world, o);
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << l.name;
  for (int k = 0; k < kTinyMoeSteps; ++k)
    EXPECT_NEAR(got.losses[k], ref.losses[k], kFloat64Tolerance * std::abs(ref.losses[k]))
        << l.name << " step " << k + 1;
  ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << l.name;
  double worst = 0;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    ASSERT_EQ(got.parameters[i].sizes(), ref.parameters[i].sizes()) << l.name << " " << i;
    const double e = relative_error(got.parameters[i], ref.parameters[i], 1e-5);
    EXPECT_LT(e, kFloat64Tolerance) << l.name << " parameter " << i;
    worst = std::max(worst, e);
  }
  std::cout << what << " " << l.name << ": final loss " << got.losses.back() << " (one GPU "
            << ref.losses.back() << "), worst parameter rel. error " << worst << "\n";
}

// Rank 0's all_to_alls in `run`.
std::vector<CollectiveRecord> rank0_all_to_alls(const HarnessRun& run) {
  std::vector<CollectiveRecord> out;
  for (const CollectiveRecord& c : run.recorders[0].collectives)
    if (c.op == "all_to_all")
      out.push_back(c);
  return out;
}

} // namespace

TEST(ExpertParallel, EveryLayoutTrainsAsOneGpu) {
  const StrategyOptions base = tiny_moe_llama(4, 0.05);
  const HarnessRun ref = run_tiny_moe(1, base);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << "the reference did not learn";
  const EpLayout layouts[] = {
      {"ep 2", 2, 2, 1, 1, 1, 0, 1, 0},
      {"ep 4", 4, 4, 1, 1, 1, 0, 1, 0},
      {"ep 2 x tp 2", 4, 2, 2, 1, 1, 0, 1, 0},
      {"ep 2 x pp 2 x dp 2, zero 1", 4, 2, 1, 2, 1, 1, 2, 0},
      {"ep 2 x pp 2 x dp 2, zero 3", 4, 2, 1, 2, 1, 3, 2, 0},
      {"ep 2 x pp 2 x dp 4, zero 1", 8, 2, 1, 2, 1, 1, 2, 0},
      {"ep 2 x pp 2 x dp 4, zero 3", 8, 2, 1, 2, 1, 3, 2, 0},
      {"ep 2 x cp 2 (dp 1)", 2, 2, 1, 1, 2, 0, 1, 0},
      {"ep 4 over dp 2 x cp 2, zero 2", 4, 4, 1, 1, 2, 2, 1, 0},
      {"ep 2, HSDP (dp 4 = 2 replicas x 2 shards), zero 1", 4, 2, 1, 1, 1, 1, 1, 2},
      {"ep 2, 2 micro-batches", 2, 2, 1, 1, 1, 0, 2, 0},
      {"ep 4 over 2 nodes of 2", 4, 4, 1, 1, 1, 0, 1, 0, 2},
      {"ep 4 over 2 nodes of 2 x pp 2, zero 3", 8, 4, 1, 2, 1, 3, 2, 0, 2},
      {"ep 2 x tp 2 over 2 nodes of 2 (one member a node)", 4, 2, 2, 1, 1, 0, 1, 0, 2},
      {"ep 4, alltoall", 4, 4, 1, 1, 1, 0, 1, 0, 0, "alltoall"},
      {"ep 2 x pp 2 x dp 2, zero 3, alltoall", 4, 2, 1, 2, 1, 3, 2, 0, 0, "alltoall"},
      {"ep 4 over 2 nodes of 2, alltoall", 4, 4, 1, 1, 1, 0, 1, 0, 2, "alltoall"},
  };
  for (const EpLayout& l : layouts)
    expect_layout_trains_as_one_gpu(base, ref, l, "moe llama");
}

// DeepSeek-V3's shape, small: multi-head latent attention (q through its low rank, values of
// another width, YaRN, interleaved rotary pairs) and the sigmoid router choosing within the
// better of 2 groups, routed outputs scaled by 2.5; trained with ep × pp × dp and ZeRO 1 (as
// DeepSeek-V3 was), with ep 4 and ZeRO 3, and with tp 2 (the latent attention split by heads,
// the rotated key part's gradient summed over tp; with q through its low rank and without),
// against one GPU.
TEST(ExpertParallel, DeepSeekShapeTrainsAsOneGpu) {
  StrategyOptions base = tiny_moe_llama(4, 0.05);
  TransformerShape& s = base.shape;
  s.kv_heads = 0;
  s.latent = LatentShape{12, 8, 4, 4, 6, true};
  s.rope_scaling.yarn = true;
  s.rope_scaling.factor = 4;
  s.rope_scaling.original_max = 8;
  s.rope_scaling.mscale = s.rope_scaling.mscale_all_dim = 1;
  s.moe.router = "sigmoid";
  s.moe.groups = 2;
  s.moe.top_groups = 1;
  s.moe.routed_scale = 2.5;
  const HarnessRun base_ref = run_tiny_moe(1, base);
  EXPECT_LT(base_ref.losses.back(), base_ref.losses.front() - 0.05) << "the reference did not learn";
  const EpLayout layouts[] = {
      {"ep 2 x pp 2 x dp 2, zero 1", 4, 2, 1, 2, 1, 1, 2, 0},
      {"ep 2 x pp 2 x dp 4, zero 1", 8, 2, 1, 2, 1, 1, 2, 0},
      {"ep 4, zero 3", 4, 4, 1, 1, 1, 3, 1, 0},
      {"ep 2 x tp 2", 4, 2, 2, 1, 1, 0, 1, 0},
      {"tp 2 x pp 2 x dp 2, zero 1", 8, 1, 2, 2, 1, 1, 2, 0},
      {"ep 4 over 2 nodes of 2, zero 3", 4, 4, 1, 1, 1, 3, 1, 0, 2},
      {"ep 4, zero 3, alltoall", 4, 4, 1, 1, 1, 3, 1, 0, 0, "alltoall"},
  };
  for (const EpLayout& l : layouts)
    expect_layout_trains_as_one_gpu(base, base_ref, l, "deepseek-shaped llama");
  // q as one projection (no q rank): the column slot is q itself.
  StrategyOptions plain_q = base;
  plain_q.shape.latent.q_rank = 0;
  expect_layout_trains_as_one_gpu(plain_q, run_tiny_moe(1, plain_q),
                                  {"tp 2, q whole (no q rank)", 2, 1, 2, 1, 1, 0, 1, 0},
                                  "deepseek-shaped llama");
}

// Each token goes once to each rank holding any of its experts (DeepEP's dispatch), with its k
// weights beside it: with top 4 of 4 experts over ep 2 every token has two experts on each
// rank, and each rank's dispatch sends the other each of its tokens once (H + 4 float64
// numbers a row), forward and, as the rows' gradients, back in backward: twice a MoE layer a
// step. No exchange sends a peer more.
TEST(ExpertParallel, SendsATokenOnceToEachRankHoldingItsExperts) {
  StrategyOptions o = tiny_moe_llama(3, 0);
  o.shape.moe.top_k = 4;
  o.ep = 2;
  const HarnessRun run = run_tiny_moe(2, o);
  const int64_t tokens = kTinyMoeGlobalBatch / 2 * o.shape.seq_len; // a rank's
  const int64_t row = (o.shape.hidden + 4) * 8;
  const int64_t moe_layers = o.shape.layers - o.shape.moe.dense_layers;
  int dispatches = 0;
  for (const CollectiveRecord& c : rank0_all_to_alls(run)) {
    ASSERT_EQ(c.peer_bytes.size(), 2u);
    EXPECT_LE(c.peer_bytes[1], tokens * row);
    dispatches += c.peer_bytes[1] == tokens * row ? 1 : 0;
  }
  EXPECT_EQ(dispatches, 2 * moe_layers * kTinyMoeSteps);
}

// Across nodes, in two levels: top 4 of 4 experts over ep 4 on 2 nodes of 2. Rank 0 sends each
// of its tokens once to the other node (to rank 2, at its place there), and each row that
// arrived at its node (its own tokens and rank 2's) once to rank 1: twice as many rows.
TEST(ExpertParallel, AcrossNodesSendsATokenOnceToEachNodeThenEachRank) {
  StrategyOptions o = tiny_moe_llama(3, 0);
  o.shape.moe.top_k = 4;
  o.ep = 4;
  o.node_size = 2;
  const HarnessRun run = run_tiny_moe(4, o);
  const int64_t tokens = kTinyMoeGlobalBatch / 4 * o.shape.seq_len; // a rank's
  const int64_t row = (o.shape.hidden + 4) * 8;
  const int64_t moe_layers = o.shape.layers - o.shape.moe.dense_layers;
  int to_node = 0, within = 0;
  for (const CollectiveRecord& c : rank0_all_to_alls(run)) {
    ASSERT_EQ(c.peer_bytes.size(), 2u);
    if (c.group == std::vector<int>{0, 2})
      to_node += c.peer_bytes[1] == tokens * row ? 1 : 0;
    else if (c.group == std::vector<int>{0, 1})
      within += c.peer_bytes[1] == 2 * tokens * row ? 1 : 0;
    else
      ADD_FAILURE() << "an all_to_all over " << c.group.size() << " ranks";
  }
  EXPECT_EQ(to_node, 2 * moe_layers * kTinyMoeSteps);
  EXPECT_EQ(within, 2 * moe_layers * kTinyMoeSteps);
}

// Megatron's alltoall dispatcher (--moe-dispatch alltoall) sends a token once for each of its
// experts, without weights: with top 4 of 4 experts over ep 2 each token has two experts on
// the other rank, so each rank sends it 2 rows a token (H float64 numbers a row) in dispatch,
// gets as many back in combine, and backward sends their gradients the other way: four such
// exchanges a MoE layer a step, after one of the counts (an int64 an expert of the peer's).
TEST(ExpertParallel, AllToAllSendsATokenOnceForEachOfItsExperts) {
  StrategyOptions o = tiny_moe_llama(3, 0);
  o.shape.moe.top_k = 4;
  o.ep = 2;
  o.moe_dispatch = "alltoall";
  const HarnessRun run = run_tiny_moe(2, o);
  const int64_t tokens = kTinyMoeGlobalBatch / 2 * o.shape.seq_len; // a rank's
  const int64_t rows = 2 * tokens * o.shape.hidden * 8;
  const int64_t moe_layers = o.shape.layers - o.shape.moe.dense_layers;
  int exchanges = 0, counts = 0;
  for (const CollectiveRecord& c : rank0_all_to_alls(run)) {
    ASSERT_EQ(c.peer_bytes.size(), 2u);
    exchanges += c.peer_bytes[1] == rows ? 1 : 0;
    counts += c.peer_bytes[1] == 2 * 8 ? 1 : 0;
    EXPECT_TRUE(c.peer_bytes[1] == rows || c.peer_bytes[1] == 2 * 8) << c.peer_bytes[1];
  }
  EXPECT_EQ(exchanges, 4 * moe_layers * kTinyMoeSteps);
  EXPECT_EQ(counts, moe_layers * kTinyMoeSteps);
}
