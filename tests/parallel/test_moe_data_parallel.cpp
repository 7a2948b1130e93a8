// A mixture-of-experts Llama (models/layers/moe.h: 4 experts, top 2, shared experts, a dense
// first layer, the balancing loss on) trained data parallel on 2 and 4 GPUs against one GPU,
// float64, 10 steps of SGD with momentum, dropless: the same routing on every side, so losses
// and final parameters agree within kFloat64Tolerance (derived in strategy_harness.h: only the
// order of the gradient sums differs). The balancing loss is taken per sequence and averaged,
// so the replicas' averaged gradients are single-device training's; a loss taken over each
// replica's batch instead would move the router's gradients by far more.
#include <gtest/gtest.h>

#include <iostream>

#include "moe_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

TEST(MoeDataParallel, TwoAndFourReplicasTrainAsOneGpu) {
  std::vector<torch::Tensor> routers; // the first MoE router after training, per loss
  for (double aux : {0.0, 0.05}) {
    const StrategyOptions options = tiny_moe_llama(3, aux);
    const HarnessRun ref = run_tiny_moe(1, options);
    for (size_t i = 0; i < ref.parameters.size(); ++i)
      if (ref.parameters[i].dim() == 2 && ref.parameters[i].size(0) == 4 &&
          ref.parameters[i].size(1) == 16) { // [experts, hidden]: the router
        routers.push_back(ref.parameters[i]);
        break;
      }
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << "the reference did not learn";
    for (int world : {2, 4}) {
      const HarnessRun got = run_tiny_moe(world, options);
      const std::string what = "ddp " + std::to_string(world) + ", balancing loss " +
                               std::to_string(aux);
      ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
      for (int k = 0; k < kTinyMoeSteps; ++k)
        EXPECT_NEAR(got.losses[k], ref.losses[k], kFloat64Tolerance * std::abs(ref.losses[k]))
            << what << " step " << k + 1;
      ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << what;
      double worst = 0;
      for (size_t i = 0; i < ref.parameters.size(); ++i) {
        const double e = relative_error(got.parameters[i], ref.parameters[i], 1e-5);
        EXPECT_LT(e, kFloat64Tolerance) << what << " parameter " << i;
        worst = std::max(worst, e);
      }
      std::cout << "moe llama " << what << ": final loss " << got.losses.back() << " (one GPU "
                << ref.losses.back() << "), worst parameter rel. error " << worst << "\n";
    }
  }
  // The balancing loss moved the router, or the runs with it prove nothing about it.
  ASSERT_EQ(routers.size(), 2u);
  EXPECT_GT(relative_error(routers[1], routers[0]), 1e-6);
}
