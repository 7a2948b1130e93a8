// Every strategy against single-device training of the same global batch: loss per step
// and final parameters within kFloat64Tolerance relative (strategy_harness.h says how it is
// derived), with SGD and momentum, over 20 steps, in float64 for both runs so that rounding
// cannot decide the result on any CPU.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <memory>

#include "memory/allocator.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kSteps = 20;
constexpr double kTolerance = kFloat64Tolerance;

StrategyOptions sgd(const std::string& model) {
  StrategyOptions o;
  o.model = model;
  o.seed = 3;
  o.optimizer.name = "sgd";
  o.optimizer.lr = 0.05;
  o.optimizer.momentum = 0.9;
  o.bucket_mb = 1.0; // several buckets for the CNN (in float64, 3.4 MB of gradients)
  o.dtype = torch::kFloat64;
  return o;
}

const Dataset& equivalence_data() {
  static const Dataset data = with_dtype(synthetic_dataset(2048, 16, 11).train, torch::kFloat64);
  return data;
}

// Single-device training of `model` on global batches of `global`: trained once per process
// (DDP and DataParallel on 4 GPUs share it).
const HarnessRun& single_reference(const std::string& model, int64_t global) {
  static std::vector<std::unique_ptr<DeviceMesh>> meshes; // outlive the returned runs
  static std::map<std::pair<std::string, int64_t>, HarnessRun> references;
  const auto key = std::make_pair(model, global);
  if (!references.count(key)) {
    torch::manual_seed(5);
    meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(1)));
    references.emplace(key, run_strategy(*meshes.back(), "single", sgd(model), equivalence_data(),
                                         global, kSteps));
  }
  return references.at(key);
}

void expect_matches_single(const std::string& strategy, const std::string& model, int world,
                           int64_t per_gpu_batch) {
  const int64_t global = per_gpu_batch * world;
  const HarnessRun& ref = single_reference(model, global);
  torch::manual_seed(5); // same permutation of the data
  DeviceMesh mesh(mesh_options(world));
  auto got = run_strategy(mesh, strategy, sgd(model), equivalence_data(), global, kSteps);

  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (int k = 0; k < kSteps; ++k)
    EXPECT_NEAR(got.losses[k], ref.losses[k], kTolerance * std::abs(ref.losses[k]))
        << strategy << " step " << k + 1;
  EXPECT_LT(ref.losses.back(), ref.losses.front()); // it did learn something
  ASSERT_EQ(got.parameters.size(), ref.parameters.size());
  double worst = 0;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    const double e = relative_error(got.parameters[i], ref.parameters[i]);
    EXPECT_LT(e, kTolerance) << strategy << " parameter " << i;
    worst = std::max(worst, e);
  }
  std::cout << strategy << " on " << world << " GPUs: final loss " << got.losses.back()
            << " (single " << ref.losses.back() << "), worst parameter relative error " << worst
            << "\n";
}

} // namespace

TEST(ParallelEquivalence, DdpMatchesSingleCnn) {
  expect_matches_single("ddp", "cnn", 4, 8);
}
TEST(ParallelEquivalence, DpMatchesSingleCnn) {
  expect_matches_single("dp", "cnn", 4, 8);
}

TEST(ParallelEquivalence, DdpWithUnevenWorld) {
  expect_matches_single("ddp", "cnn", 3, 10);
}

TEST(ParallelEquivalence, DpPeakOnGpu0AboveEveryOtherGpu) {
  const auto data = with_dtype(synthetic_dataset(512, 16, 11).train, torch::kFloat64);
  DeviceMesh mesh(mesh_options(4));
  run_strategy(mesh, "dp", sgd("cnn"), data, 64, 3);
  for (int r = 1; r < 4; ++r)
    EXPECT_GT(mesh.gpu(0).peak_bytes(), mesh.gpu(r).peak_bytes()) << "gpu" << r;
}
