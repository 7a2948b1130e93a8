// The mesh engine (dp × tp × pp with ZeRO) on the GPT against single-device training of the
// same global batches: loss per step and final gathered parameters within kFloat64Tolerance
// relative (derived in strategy_harness.h), with SGD over 10 steps, in float64 for both runs.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <mutex>

#include "data/text.h"
#include "mesh/parallel_dims.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kMeshSteps = 10;
constexpr double kMeshTolerance = kFloat64Tolerance;  // float64: see strategy_harness.h
constexpr int64_t kMeshGlobalBatch = 16;

StrategyOptions gpt_sgd() { return tiny_gpt_sgd(torch::kFloat64); }

const Dataset& mesh_text() {
  static const Dataset data = synthetic_text(512, 16, 16, 64, 3).train;
  return data;
}

HarnessRun run_mesh(int world, const StrategyOptions& options) {
  MeshOptions m;
  m.world_size = world;
  m.capacity_bytes = int64_t{1} << 30;
  static std::vector<std::unique_ptr<DeviceMesh>> meshes;  // outlive the returned run
  meshes.push_back(std::make_unique<DeviceMesh>(m));
  torch::manual_seed(5);  // the same permutation of the data for every run
  return run_strategy(*meshes.back(),
                      world == 1 && options.tp == 1 && options.pp == 1 && options.zero == 0 &&
                              options.recompute == Recompute::None && options.micro_batches == 1
                          ? "single"
                          : "ddp",
                      options, mesh_text(), kMeshGlobalBatch, kMeshSteps);
}

const HarnessRun& mesh_reference() {
  static const HarnessRun ref = run_mesh(1, gpt_sgd());
  return ref;
}

void expect_mesh_matches_single(int world, const StrategyOptions& options, const std::string& what,
                                const HarnessRun* reference = nullptr) {
  const HarnessRun& ref = reference ? *reference : mesh_reference();
  const HarnessRun got = run_mesh(world, options);
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (int k = 0; k < kMeshSteps; ++k)
    EXPECT_NEAR(got.losses[k], ref.losses[k], kMeshTolerance * std::abs(ref.losses[k]))
        << what << " step " << k + 1;
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << "the reference did not learn";
  ASSERT_EQ(got.parameters.size(), ref.parameters.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ref.parameters.size(); ++i) {
    ASSERT_EQ(got.parameters[i].sizes(), ref.parameters[i].sizes()) << what << " parameter " << i;
    const double e = relative_error(got.parameters[i], ref.parameters[i], 1e-5);
    EXPECT_LT(e, kMeshTolerance) << what << " parameter " << i;
    worst = std::max(worst, e);
  }
  std::cout << what << ": final loss " << got.losses.back() << " (single " << ref.losses.back()
            << "), worst parameter rel. error " << worst << "\n";
}

StrategyOptions mesh_with(int tp, int pp, int zero, const std::string& schedule = "1f1b",
                     int micro_batches = 1, Recompute recompute = Recompute::None) {
  StrategyOptions o = gpt_sgd();
  o.tp = tp;
  o.pp = pp;
  o.zero = zero;
  o.schedule = schedule;
  o.micro_batches = micro_batches;
  o.recompute = recompute;
  return o;
}

} // namespace

TEST(MeshEquivalence, ThreeDimensionalWithZero1) {
  expect_mesh_matches_single(8, mesh_with(2, 2, 1, "1f1b", 2), "dp2 tp2 pp2 zero1 1f1b");
}
TEST(MeshEquivalence, ThreeDimensionalWithZero1AndRecompute) {
  expect_mesh_matches_single(8, mesh_with(2, 2, 1, "1f1b", 2, Recompute::Full),
                        "dp2 tp2 pp2 zero1 recompute");
}
TEST(MeshEquivalence, ThreeDimensionalWithZero1AndSelectiveRecompute) {
  expect_mesh_matches_single(8, mesh_with(2, 2, 1, "1f1b", 2, Recompute::Selective),
                        "dp2 tp2 pp2 zero1 selective recompute");
}
TEST(MeshEquivalence, TensorParallel2And4) {
  expect_mesh_matches_single(2, mesh_with(2, 1, 0), "tp2");
  expect_mesh_matches_single(4, mesh_with(4, 1, 0), "tp4");
}
// Sequence parallelism changes where the sums happen (reduce-scatter and all-gather along
// the sequence, the norms' and row biases' gradients summed over the tp group), not what is
// computed: it must match single-device training as plain tensor parallelism does.
TEST(MeshEquivalence, SequenceParallel) {
  const auto sp = [](StrategyOptions o) {
    o.sequence_parallel = true;
    return o;
  };
  expect_mesh_matches_single(2, sp(mesh_with(2, 1, 0)), "tp2 sequence parallel");
  expect_mesh_matches_single(4, sp(mesh_with(4, 1, 0)), "tp4 sequence parallel");
  expect_mesh_matches_single(4, sp(mesh_with(2, 2, 0, "1f1b", 2)), "tp2 pp2 1f1b sequence parallel");
  expect_mesh_matches_single(4, sp(mesh_with(2, 1, 1)), "dp2 tp2 zero1 sequence parallel");
  expect_mesh_matches_single(8, sp(mesh_with(2, 2, 1, "gpipe", 2, Recompute::Full)),
                        "dp2 tp2 pp2 zero1 gpipe recompute sequence parallel");
}
TEST(MeshEquivalence, PipelineGpt) {
  expect_mesh_matches_single(2, mesh_with(1, 2, 0, "gpipe", 4), "pp2 gpipe");
  expect_mesh_matches_single(4, mesh_with(1, 4, 0, "1f1b", 4), "pp4 1f1b");
  expect_mesh_matches_single(4, mesh_with(1, 4, 0, "naive"), "pp4 naive");
}
// Interleaved 1F1B: the 4 blocks as 4 chunks on 2 stages, rank 0 holding blocks 0 (with the
// embedding) and 2, rank 1 blocks 1 and 3 (with the head), activations going round twice.
TEST(MeshEquivalence, InterleavedPipelineGpt) {
  const auto interleaved = [](StrategyOptions o) {
    o.virtual_stages = 2;
    return o;
  };
  expect_mesh_matches_single(2, interleaved(mesh_with(1, 2, 0, "1f1b", 4)), "pp2 V2 1f1b");
  expect_mesh_matches_single(2, interleaved(mesh_with(1, 2, 0, "1f1b", 2)), "pp2 V2 1f1b, M = P");
  expect_mesh_matches_single(4, interleaved(mesh_with(1, 2, 0, "1f1b", 4)), "dp2 pp2 V2 1f1b");
  expect_mesh_matches_single(8, interleaved(mesh_with(2, 2, 1, "1f1b", 2)), "dp2 tp2 pp2 V2 zero1 1f1b");
}
// Megatron-LM 2021's scatter/gather of the pipeline's messages: each tp rank sends 1/tp of an
// activation or gradient that every tp rank holds whole, and the receiving stage all-gathers
// the parts. It moves the same values, so the runs match single-device training and, bitwise,
// the same layout sending whole messages; each send carries 1/tp of the bytes, and each
// receive is followed by an all-gather over the receiver's tp group.
TEST(MeshEquivalence, PipelineMessagesScatteredOverTp) {
  const auto scattered = [](StrategyOptions o, int virtual_stages = 1) {
    o.pp_scatter_gather = true;
    o.virtual_stages = virtual_stages;
    return o;
  };
  expect_mesh_matches_single(8, scattered(mesh_with(2, 2, 1, "1f1b", 2)),
                             "dp2 tp2 pp2 zero1 1f1b, messages scattered");
  expect_mesh_matches_single(8, scattered(mesh_with(4, 2, 0, "gpipe", 2, Recompute::Full)),
                             "tp4 pp2 gpipe recompute, messages scattered");
  expect_mesh_matches_single(4, scattered(mesh_with(2, 2, 0, "1f1b", 2), 2),
                             "tp2 pp2 V2 1f1b, messages scattered");

  const HarnessRun whole = run_mesh(4, mesh_with(2, 2, 0, "1f1b", 2));
  const HarnessRun split = run_mesh(4, scattered(mesh_with(2, 2, 0, "1f1b", 2)));
  EXPECT_EQ(split.losses, whole.losses);
  ASSERT_EQ(split.parameters.size(), whole.parameters.size());
  for (size_t i = 0; i < whole.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(split.parameters[i], whole.parameters[i])) << "parameter " << i;
  // The step's messages come first on each rank: 2 micro-batches a step each way; after them
  // the harness gathers the final parameters.
  const size_t step_messages = static_cast<size_t>(kMeshSteps) * 2;
  const ParallelDims dims = ParallelDims::make(4, 2, 2);
  for (int rank = 0; rank < 4; ++rank) {
    const auto records = [&](const HarnessRun& run, const std::string& op, bool tp_only = false) {
      std::vector<int64_t> bytes;
      for (const CollectiveRecord& c : run.recorders[static_cast<size_t>(rank)].collectives)
        if (c.op == op && (!tp_only || c.group == dims.tp_group(rank).ranks))
          bytes.push_back(c.bytes);
      return bytes;
    };
    for (const std::string op : {"send", "recv"}) {
      const std::vector<int64_t> a = records(whole, op), b = records(split, op);
      ASSERT_GE(a.size(), step_messages) << "rank " << rank << " " << op;
      ASSERT_EQ(a.size(), b.size()) << "rank " << rank << " " << op;
      for (size_t i = 0; i < step_messages; ++i)
        EXPECT_EQ(b[i] * 2, a[i]) << "rank " << rank << " " << op << " #" << i;
    }
    EXPECT_EQ(records(split, "all_gather", true).size(),
              records(whole, "all_gather", true).size() + step_messages)
        << "rank " << rank;
  }
}
TEST(MeshEquivalence, ZeroStagesOnGpt) {
  for (int stage = 1; stage <= 3; ++stage)
    expect_mesh_matches_single(4, mesh_with(1, 1, stage), "zero" + std::to_string(stage));
}
TEST(MeshEquivalence, RecomputeAndAccumulation) {
  expect_mesh_matches_single(1, mesh_with(1, 1, 0, "1f1b", 1, Recompute::Full), "recompute on one GPU");
  expect_mesh_matches_single(1, mesh_with(1, 1, 0, "1f1b", 1, Recompute::Selective),
                        "selective recompute on one GPU");
  expect_mesh_matches_single(2, mesh_with(2, 1, 0, "1f1b", 1, Recompute::Selective), "tp2 selective");
  expect_mesh_matches_single(4, mesh_with(1, 1, 3, "1f1b", 2, Recompute::Selective),
                        "zero3 with 2 micro-batches, selective");
  expect_mesh_matches_single(2, mesh_with(1, 1, 0, "1f1b", 4), "dp2 with 4 micro-batches");
}

namespace {

// A tied head, or another depth: its own single-device reference, trained once.
const HarnessRun& shape_reference(bool tie_head, int64_t layers) {
  static std::map<std::pair<bool, int64_t>, HarnessRun> refs;
  const auto key = std::make_pair(tie_head, layers);
  if (!refs.count(key)) {
    StrategyOptions o = gpt_sgd();
    o.shape.tie_head = tie_head;
    o.shape.layers = layers;
    refs.emplace(key, run_mesh(1, o));
  }
  return refs.at(key);
}

StrategyOptions shaped(StrategyOptions o, bool tie_head, int64_t layers,
                       std::vector<int64_t> stage_layers = {}, int virtual_stages = 1) {
  o.shape.tie_head = tie_head;
  o.shape.layers = layers;
  o.stage_layers = std::move(stage_layers);
  o.virtual_stages = virtual_stages;
  return o;
}

} // namespace

// Megatron's distributed optimizer (ZeRO 1 reducing-scattering the gradients, the parameters
// gathered block by block in the next forward) on tp, sequence parallelism, pp (untied: see
// validate_layout) and interleaving.
TEST(MeshEquivalence, DistributedOptimizer) {
  const auto distributed = [](StrategyOptions o) {
    o.distributed_optimizer = true;
    return o;
  };
  expect_mesh_matches_single(4, distributed(mesh_with(1, 1, 1, "1f1b", 2)), "dp4 zero1 distributed");
  StrategyOptions sp = distributed(mesh_with(2, 1, 1));
  sp.sequence_parallel = true;
  expect_mesh_matches_single(4, sp, "dp2 tp2 zero1 distributed sequence parallel");
  const HarnessRun& untied = shape_reference(false, 4);
  expect_mesh_matches_single(8, distributed(shaped(mesh_with(2, 2, 1, "1f1b", 2), false, 4)),
                             "dp2 tp2 pp2 zero1 distributed", &untied);
  expect_mesh_matches_single(8, distributed(shaped(mesh_with(2, 2, 1, "1f1b", 2), false, 4, {}, 2)),
                             "dp2 tp2 pp2 V2 zero1 distributed", &untied);
}

// A tied head across stages, as Megatron shares the word embedding: the first stage holds the
// embedding, the last a copy for the head, and the embedding group sums the copies' gradients.
// Single-device training of the tied model sums the two uses' gradients into one weight: the
// same sum, so every layout must match it (one copy comes back from full_parameters()).
TEST(MeshEquivalence, TiedEmbeddingAcrossStages) {
  const HarnessRun& ref = shape_reference(true, 4);
  expect_mesh_matches_single(2, shaped(mesh_with(1, 2, 0, "gpipe", 4), true, 4), "tied pp2 gpipe", &ref);
  expect_mesh_matches_single(2, shaped(mesh_with(1, 2, 0, "1f1b", 4), true, 4), "tied pp2 1f1b", &ref);
  expect_mesh_matches_single(4, shaped(mesh_with(1, 4, 0, "1f1b", 4), true, 4),
                             "tied pp4 1f1b (middle stages hold neither copy)", &ref);
  expect_mesh_matches_single(4, shaped(mesh_with(1, 2, 1, "1f1b", 2), true, 4), "tied dp2 pp2 zero1",
                             &ref);
  expect_mesh_matches_single(4, shaped(mesh_with(2, 2, 0, "1f1b", 2), true, 4), "tied tp2 pp2", &ref);
  // Interleaved: the embedding is in chunk 0 (rank 0), the head in chunk 3 (rank 1).
  expect_mesh_matches_single(2, shaped(mesh_with(1, 2, 0, "1f1b", 2), true, 4, {}, 2),
                             "tied pp2 V2 interleaved", &ref);
}

// Stages of unequal size (Megatron's uneven first and last stage, or a list): the cut moves,
// the computation does not. 5 blocks on 2 stages as 2+3, on 3 stages as 1,3,1, and as 4
// interleaved chunks of 1,2,1,1; a tied head with them too.
TEST(MeshEquivalence, UnequalPipelineStages) {
  const HarnessRun& ref = shape_reference(false, 5);
  expect_mesh_matches_single(2, shaped(mesh_with(1, 2, 0, "1f1b", 4), false, 5, {2, 3}),
                             "pp2 stages 2,3", &ref);
  expect_mesh_matches_single(3, shaped(mesh_with(1, 3, 0, "gpipe", 2), false, 5, {1, 3, 1}),
                             "pp3 stages 1,3,1", &ref);
  expect_mesh_matches_single(2, shaped(mesh_with(1, 2, 0, "1f1b", 2), false, 5, {1, 2, 1, 1}, 2),
                             "pp2 V2 chunks 1,2,1,1", &ref);
  expect_mesh_matches_single(4, shaped(mesh_with(1, 2, 1, "1f1b", 2), true, 5, {4, 1}),
                             "tied dp2 pp2 zero1 stages 4,1", &shape_reference(true, 5));
}

// The two copies of a tied embedding stay bitwise equal step after step, under mixed
// precision (bf16 parameters and gradients, fp32 master weights in Adam) with dp 2 and ZeRO 1:
// the embedding group's sum of two gradients is the same bits on both, and the same update of
// the same values is too.
TEST(MeshEquivalence, TiedEmbeddingCopiesStayBitwiseEqual) {
  StrategyOptions o = shaped(mesh_with(1, 2, 1, "1f1b", 2), true, 4);
  o.dtype = torch::kFloat32;
  o.precision = "bf16";
  o.optimizer.name = "adam";
  o.optimizer.lr = 1e-2;
  o.optimizer.momentum = 0;
  MeshOptions m;
  m.world_size = 4;
  m.capacity_bytes = int64_t{1} << 30;
  DeviceMesh mesh(m);
  std::mutex lock;
  std::map<std::pair<int, int>, torch::Tensor> copies;  // (rank, step) -> its copy
  const ParallelDims dims = ParallelDims::make(4, 1, 2);
  torch::manual_seed(5);
  const HarnessRun run = run_strategy(
      mesh, "ddp", o, mesh_text(), kMeshGlobalBatch, 4, [&](RankContext& ctx, Strategy& s, int step) {
        const std::string name = dims.coord(ctx.rank).pp == 0 ? "embed.wte" : "head.weight";
        for (const auto& p : s.model()->named_parameters())
          if (p.key() == name) {
            GpuGuard host(nullptr);
            std::lock_guard<std::mutex> guard(lock);
            copies[{ctx.rank, step}] = p.value().detach().clone();
          }
      });
  ASSERT_EQ(copies.size(), 16u) << "every rank holds one copy";
  for (int step = 1; step <= 4; ++step)
    for (int dp = 0; dp < 2; ++dp) {
      const torch::Tensor& first = copies.at({dims.rank({dp, 0, 0}), step});
      const torch::Tensor& last = copies.at({dims.rank({dp, 0, 1}), step});
      EXPECT_EQ(first.scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(first, last)) << "step " << step << " replica " << dp;
      if (step > 1) {
        EXPECT_FALSE(torch::equal(first, copies.at({dims.rank({dp, 0, 0}), step - 1})))
            << "the embedding did not train at step " << step;
      }
    }
  EXPECT_EQ(run.losses.size(), 4u);
}
