// Expert parallelism (parallel/expert/expert_parallel.h): a mixture-of-experts Llama (4
// experts, top 2, shared experts, a dense first layer, the balancing loss on) trained with its
// routed experts split over ep ranks, against one GPU: float64, 10 steps of SGD with
// momentum, dropless, so the routing is the same on both sides and only the order of the
// gradient sums differs: losses and final parameters within kFloat64Tolerance
// (strategy_harness.h). Layouts: ep 2 and 4 (all of dp), ep 2 × tp 2, ep 2 × pp 2 × dp 2 with
// ZeRO 1 and ZeRO 3 (experts sharded over edp, the dense parameters over dp), cp 2 × ep 2
// (the balancing loss over whole sequences), ep 2 with HSDP.
#include <gtest/gtest.h>

#include <iostream>

#include "models/layers/moe.h"
#include "parallel/expert/expert_parallel.h"
#include "moe_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

struct EpLayout {
  const char* name;
  int world, ep, tp, pp, cp, zero, micro_batches, dp_shard;
};

} // namespace

TEST(ExpertParallel, EveryLayoutTrainsAsOneGpu) {
  const StrategyOptions base = tiny_moe_llama(4, 0.05);
  const HarnessRun ref = run_tiny_moe(1, base);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << "the reference did not learn";
  const EpLayout layouts[] = {
      {"ep 2", 2, 2, 1, 1, 1, 0, 1, 0},
      {"ep 4", 4, 4, 1, 1, 1, 0, 1, 0},
      {"ep 2 x tp 2", 4, 2, 2, 1, 1, 0, 1, 0},
      {"ep 2 x pp 2 x dp 2, zero 1", 8, 2, 1, 2, 1, 1, 2, 0},
      {"ep 2 x pp 2 x dp 2, zero 3", 8, 2, 1, 2, 1, 3, 2, 0},
      {"ep 2 x cp 2 (dp 1)", 2, 2, 1, 1, 2, 0, 1, 0},
      {"ep 4 over dp 2 x cp 2, zero 2", 4, 4, 1, 1, 2, 2, 1, 0},
      {"ep 2, HSDP (dp 4 = 2 replicas x 2 shards), zero 1", 4, 2, 1, 1, 1, 1, 1, 2},
      {"ep 2, 2 micro-batches", 2, 2, 1, 1, 1, 0, 2, 0},
  };
  for (const EpLayout& l : layouts) {
    StrategyOptions o = base;
    o.ep = l.ep;
    o.tp = l.tp;
    o.pp = l.pp;
    o.cp = l.cp;
    o.zero = l.zero;
    o.micro_batches = l.micro_batches;
    o.dp_shard = l.dp_shard;
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
    std::cout << "moe llama " << l.name << ": final loss " << got.losses.back() << " (one GPU "
              << ref.losses.back() << "), worst parameter rel. error " << worst << "\n";
  }
}
