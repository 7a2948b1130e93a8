// ZeRO over parameter groups: each parameter is reduced and sharded over its own group. Four
// ranks; the first Linear's weight and the second's bias over pairs ({0,1} and {2,3}, as
// experts over "edp" would be), the second's weight over all four. Every value is computed by
// hand: the broadcast from each group's first rank, the averaged gradients (one SGD step with
// lr 1 subtracts them exactly, in float64), and the bytes each rank holds for every stage.
#include <gtest/gtest.h>

#include <mutex>

#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "parallel/data/zero.h"
#include "strategy_harness.h"

using namespace meshsim;

namespace zero_groups_test {

torch::Tensor values(std::initializer_list<double> v, std::vector<int64_t> sizes) {
  return torch::tensor(std::vector<double>(v), torch::kFloat64).view(sizes);
}

/// a: Linear(3, 2) without bias, b: Linear(2, 1). Rank r starts from its own values (a.w
/// plus 10·r, b.w plus 7·r, b.b plus r), so the broadcasts decide what every rank holds.
torch::nn::Sequential model_of(int rank) {
  static std::mutex mutex;  // Linear's initialization draws from the global generator
  std::lock_guard<std::mutex> lock(mutex);
  torch::nn::Sequential m;
  m->push_back("a", torch::nn::Linear(torch::nn::LinearOptions(3, 2).bias(false)));
  m->push_back("b", torch::nn::Linear(2, 1));
  m->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  auto p = m->parameters();  // a.weight, b.weight, b.bias
  p[0].copy_(values({1, 2, 3, 4, 5, 6}, {2, 3}) + 10.0 * rank);
  p[1].copy_(values({1, -1}, {1, 2}) + 7.0 * rank);
  p[2].copy_(values({0.5}, {1}) + 1.0 * rank);
  return m;
}

struct Bytes {
  int64_t parameters, gradients, flat;
};

// Stage 3: a unit per block and group: b.b (1 element over 2: padded to 2), b.w (2 over 4:
// padded to 4), a.w (6 over 2); a rank keeps 1 + 1 + 3 elements. Stages 1-2: one bucket per
// group: {b.b, a.w} (7 elements, padded to 8, shard 4) and {b.w} (padded to 4, shard 1).
// Stage 0 pads nothing: 7 + 2 elements. Eight bytes an element.
Bytes expected_bytes(int stage) {
  switch (stage) {
  case 0: return {72, 72, 72};
  case 1: return {96, 96, 96};
  case 2: return {96, 40, 96};
  default: return {40, 40, 96};
  }
}

void check_stage(int stage) {
  DeviceMesh mesh(meshsim::testing::mesh_options(4, int64_t{1} << 30));
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::nn::Sequential model;
    {
      CategoryScope scope(MemoryCategory::Parameters);
      model = model_of(ctx.rank);
    }
    const Group pair{ctx.rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}};
    std::vector<ParamGroup> groups{{"edp", pair, {0, 2}}, {"dp_cp", Group::world(4), {1}}};
    OptimizerOptions sgd;
    sgd.name = "sgd";
    sgd.lr = 1;
    sgd.momentum = 0;
    ZeroDataParallel zero(ctx, model, groups, ZeroOptions{stage, 25, sgd});
    const Bytes want = expected_bytes(stage);
    EXPECT_EQ(zero.flat_bytes(), want.flat) << "gpu" << ctx.rank;

    zero.zero_grad();
    {
      CategoryScope scope(MemoryCategory::Activations);
      // x = [r+1, 1, 0]: the gradient of the output's sum is x for each row of a.w (times
      // b.w = [1, -1], the broadcast one), a.w · x for b.w, and 1 for b.b.
      const torch::Tensor x = values({ctx.rank + 1.0, 1, 0}, {1, 3});
      zero.module()->forward(x).sum().backward();
    }
    zero.finish_gradients(1);
    zero.step(1);
    EXPECT_EQ(ctx.gpu.stats().current_by_category[static_cast<size_t>(MemoryCategory::Parameters)],
              want.parameters)
        << "gpu" << ctx.rank;
    EXPECT_EQ(ctx.gpu.stats().current_by_category[static_cast<size_t>(MemoryCategory::Gradients)],
              want.gradients)
        << "gpu" << ctx.rank;

    GpuGuard host(nullptr);
    const auto full = zero.full_parameters();
    ASSERT_EQ(full.size(), 3u);
    // a.w from rank 0 (pair {0,1}) or rank 2 (pair {2,3}: +20), minus the pair's mean of
    // [[r+1, 1, 0], [-(r+1), -1, 0]]: 1.5 for {0,1}, 3.5 for {2,3}.
    const torch::Tensor a_w = ctx.rank < 2 ? values({-0.5, 1, 3, 5.5, 6, 6}, {2, 3})
                                           : values({17.5, 21, 23, 27.5, 26, 26}, {2, 3});
    // b.w from rank 0, minus the mean over all four of a.w · x: [3, 9], [4, 13] (rank 0's a.w),
    // [85, 97], [106, 121] (rank 2's), so [49.5, 60].
    const torch::Tensor b_w = values({-48.5, -61}, {1, 2});
    // b.b from rank 0 (0.5) or rank 2 (2.5), minus 1.
    const torch::Tensor b_b = values({ctx.rank < 2 ? -0.5 : 1.5}, {1});
    EXPECT_TRUE(torch::equal(full[0], a_w)) << "stage " << stage << " gpu" << ctx.rank << "\n"
                                            << full[0];
    EXPECT_TRUE(torch::equal(full[1], b_w)) << "stage " << stage << " gpu" << ctx.rank << "\n"
                                            << full[1];
    EXPECT_TRUE(torch::equal(full[2], b_b)) << "stage " << stage << " gpu" << ctx.rank << "\n"
                                            << full[2];
  });
}

} // namespace zero_groups_test

TEST(ZeroGroups, Stage0ReducesEachGroupOverItsRanks) { zero_groups_test::check_stage(0); }
TEST(ZeroGroups, Stage1ReducesEachGroupOverItsRanks) { zero_groups_test::check_stage(1); }
TEST(ZeroGroups, Stage2ReducesEachGroupOverItsRanks) { zero_groups_test::check_stage(2); }
TEST(ZeroGroups, Stage3ReducesEachGroupOverItsRanks) { zero_groups_test::check_stage(3); }

TEST(ZeroGroups, RejectsAParameterInNoGroupOrInTwo) {
  DeviceMesh mesh(meshsim::testing::mesh_options(1, int64_t{1} << 30));
  run_ranks(mesh, [&](RankContext& ctx) {
    CategoryScope scope(MemoryCategory::Parameters);
    auto message = [&](std::vector<ParamGroup> groups) {
      try {
        ZeroDataParallel(ctx, zero_groups_test::model_of(0), std::move(groups),
                         ZeroOptions{1, 25, {}});
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const Group one = Group::world(1);
    EXPECT_EQ(message({{"dp_cp", one, {0, 1}}}), "zero: parameter 2 is in no parameter group");
    EXPECT_EQ(message({{"dp_cp", one, {0, 1, 2}}, {"edp", one, {1}}}),
              "zero: parameter 1 is in the dp_cp and edp groups");
    EXPECT_EQ(message({{"dp_cp", one, {0, 1, 2, 3}}}),
              "zero: dp_cp group names parameter 3 of a model with 3");
    EXPECT_EQ(message({{"edp", Group{{1}}, {0, 1, 2}}}),
              "zero: rank 0 is not in its edp group [1]");
  });
}
