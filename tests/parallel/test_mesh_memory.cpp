// Exact model-state memory of the mesh engine on the GPT, measured on the virtual GPUs
// between steps: ZeRO stages 0-3 with fp32 Adam hold 16Ψ, 8Ψ + 8Ψ/dp, 4Ψ + 12Ψ/dp and
// 16Ψ/dp bytes in parameters + gradients + optimizer; tensor parallelism at tp=2 halves the
// transformer blocks' parameters except the replicated LayerNorms and row-parallel biases.
#include <gtest/gtest.h>

#include <mutex>

#include "data/text.h"
#include "strategy_harness.h"

using namespace meshsim;
using namespace meshsim::testing;

namespace {

constexpr int kDp = 4;

StrategyOptions gpt_adam() {
  StrategyOptions o;
  o.model = "gpt";
  o.shape.layers = 2;
  o.shape.hidden = 32;
  o.shape.heads = 4;
  o.shape.seq_len = 16;
  o.shape.vocab = 64;
  o.bucket_mb = 0.05;
  return o;
}

// Every block of this GPT (embed 2,560, blocks 12,704 each, ln_f 64, head 2,048) divides by
// dp = 4, so no shard is padded and the formulas hold to the byte.
constexpr int64_t kPsi = 2560 + 2 * 12704 + 64 + 2048;
constexpr int64_t kLargestBlock = 4 * 12704;

int64_t bytes(const MemoryStats& s, MemoryCategory c, bool peak = false) {
  return (peak ? s.peak_by_category : s.current_by_category)[static_cast<size_t>(c)];
}

struct Between {
  int64_t parameters, gradients, optimizer;
};

// Runs 3 Adam steps and checks, on every GPU after every step, the model-state bytes; peaks
// are measured over steps 2 and 3 (after the first step allocated the optimizer state).
void expect_zero_stage(int stage, Between expected) {
  StrategyOptions o = gpt_adam();
  o.zero = stage;
  MeshOptions m;
  m.world_size = kDp;
  m.capacity_bytes = int64_t{1} << 30;
  DeviceMesh mesh(m);
  const auto data = synthetic_text(256, 8, 16, 64, 1).train;
  std::mutex mutex;
  std::vector<MemoryStats> at_end(kDp);
  run_strategy(mesh, "ddp", o, data, 16, 3, [&](RankContext& ctx, Strategy&, int step) {
    const MemoryStats s = ctx.gpu.stats();
    EXPECT_EQ(bytes(s, MemoryCategory::Parameters), expected.parameters)
        << "zero " << stage << " gpu" << ctx.rank << " step " << step;
    EXPECT_EQ(bytes(s, MemoryCategory::Gradients), expected.gradients)
        << "zero " << stage << " gpu" << ctx.rank << " step " << step;
    EXPECT_EQ(bytes(s, MemoryCategory::Optimizer), expected.optimizer)
        << "zero " << stage << " gpu" << ctx.rank << " step " << step;
    if (step == 1) ctx.gpu.reset_peaks();
    if (step == 3) {
      std::lock_guard<std::mutex> lock(mutex);
      at_end[ctx.rank] = s;
    }
  });
  for (int r = 0; r < kDp; ++r) {
    const auto& s = at_end[r];
    // Inside a step: stage 2's gradients never exceed their shard (the bucket being
    // reduce-scattered is communication); stage 3's parameters never exceed the shard plus
    // three gathered blocks (in backward: the one whose gradients are still arriving, the one
    // whose backward starts, and the one prefetched for the next).
    if (stage == 2) {
      EXPECT_EQ(bytes(s, MemoryCategory::Gradients, true), expected.gradients) << "gpu" << r;
    }
    if (stage == 3) {
      EXPECT_GT(bytes(s, MemoryCategory::Parameters, true), expected.parameters + kLargestBlock)
          << "gpu" << r; // a block and the next one at once
      EXPECT_LE(bytes(s, MemoryCategory::Parameters, true),
                expected.parameters + 3 * kLargestBlock)
          << "gpu" << r;
    }
    ::testing::Test::RecordProperty(
        "zero" + std::to_string(stage) + "_gpu" + std::to_string(r) + "_model_state",
        std::to_string(expected.parameters + expected.gradients + expected.optimizer));
  }
}

} // namespace

TEST(MeshMemory, GptHasTheParameterCountTheFormulasUse) {
  ModelOptions o;
  o.shape = gpt_adam().shape;
  EXPECT_EQ(count_parameters(*build_model("gpt", o)), kPsi);
}

TEST(MeshMemory, ZeroStagesHoldExactlyTheirShareOfModelState) {
  const int64_t psi = kPsi;
  expect_zero_stage(0, {4 * psi, 4 * psi, 8 * psi});                // 16Ψ
  expect_zero_stage(1, {4 * psi, 4 * psi, 8 * psi / kDp});          // 8Ψ + 8Ψ/dp
  expect_zero_stage(2, {4 * psi, 4 * psi / kDp, 8 * psi / kDp});    // 4Ψ + 12Ψ/dp
  expect_zero_stage(3, {4 * psi / kDp, 4 * psi / kDp, 8 * psi / kDp});  // 16Ψ/dp
}

TEST(MeshMemory, TensorParallelHalvesTheBlocks) {
  // Per block: q, k, v, mlp.fc split by rows (weights and biases); attn.out and mlp.proj
  // split by columns (weights; their biases are added after the all-reduce, replicated);
  // ln1 and ln2 replicated. The position embedding and ln_f stay whole; the word embedding
  // and the head (untied here) are split by rows, over the vocabulary.
  const int64_t h = 32, replicated = 2 * (2 * h) + 2 * h;  // ln1, ln2; out and proj biases
  const int64_t block = 12704, outside = 512 + 64, wte = 2048, head = 2048;
  for (int tp : {1, 2}) {
    StrategyOptions o = gpt_adam();
    o.tp = tp;
    o.zero = tp == 1 ? 1 : 0;  // tp = 1 alone would be plain ddp; zero 1 keeps full parameters
    MeshOptions m;
    m.world_size = tp;
    m.capacity_bytes = int64_t{1} << 30;
    DeviceMesh mesh(m);
    const auto data = synthetic_text(64, 8, 16, 64, 1).train;
    const int64_t expected =
        4 * (outside + wte / tp + head / tp + 2 * ((block - replicated) / tp + replicated));
    run_strategy(mesh, "ddp", o, data, 8, 1, [&](RankContext& ctx, Strategy&, int) {
      EXPECT_EQ(bytes(ctx.gpu.stats(), MemoryCategory::Parameters), expected)
          << "tp " << tp << " gpu" << ctx.rank;
    });
  }
}
