// FP8 training in plans (--precision fp8): the GPUs' FP8 peaks, what a block's pass costs when
// its linear GEMMs run in FP8 and what stays in bf16, the memory an FP8 plan charges beside
// bf16's (parallel/fp8_state.h), and the one-line refusals.
#include <gtest/gtest.h>

#include <algorithm>

#include "../cli/cli_harness.h"
#include "cost/hardware.h"
#include "cost/predict.h"
#include "cost/roofline.h"
#include "parallel/fp8_state.h"
#include "plan/plan.h"

namespace meshsim {
namespace {

TEST(CostHardware, Fp8PeaksAreTheDatasheetsDensePeaks) {
  EXPECT_EQ(parse_dtype("fp8"), Dtype::FP8);
  EXPECT_DOUBLE_EQ(dtype_bytes(Dtype::FP8), 1);
  // "with sparsity" halved: H100/H200/H800 3,958; B200 9,000 (72 PF / 8); GB200 10,000
  // (720 PF / 72); L4 485. The 4090's 330.3 is the whitepaper's dense FP32-accumulate rate.
  for (const char* hopper : {"h100", "h200", "h800"}) {
    EXPECT_DOUBLE_EQ(gpu_preset(hopper).peak_flops(Dtype::FP8), 1979e12) << hopper;
    EXPECT_EQ(gpu_preset(hopper).arch, GpuArch::Hopper) << hopper;
  }
  EXPECT_DOUBLE_EQ(gpu_preset("b200").peak_flops(Dtype::FP8), 4500e12);
  EXPECT_DOUBLE_EQ(gpu_preset("gb200").peak_flops(Dtype::FP8), 5000e12);
  EXPECT_DOUBLE_EQ(gpu_preset("4090").peak_flops(Dtype::FP8), 330.3e12);
  EXPECT_DOUBLE_EQ(gpu_preset("l4").peak_flops(Dtype::FP8), 242.5e12);
  for (const char* none : {"v100-32", "a100-80", "2080ti"})
    EXPECT_EQ(gpu_preset(none).peak_flops(Dtype::FP8), 0) << none;
  // H200 SXM's datasheet: FP32 67 TF, TF32 989, BF16 1,979, FP8 3,958 "with sparsity",
  // 141 GB of HBM3e at 4.8 TB/s.
  const GpuSpec h200 = gpu_preset("h200");
  EXPECT_DOUBLE_EQ(h200.fp32_flops, 67e12);
  EXPECT_DOUBLE_EQ(h200.peak_flops(Dtype::TF32), 494.5e12);
  EXPECT_DOUBLE_EQ(h200.peak_flops(Dtype::BF16), 989.5e12);
  EXPECT_DOUBLE_EQ(h200.mem_bytes, 141e9);
  EXPECT_DOUBLE_EQ(h200.mem_bw, 4.8e12);
  // h100-96: Meta's Grand Teton card at its 500 W limit, 96 GB at 2.4 TB/s. Its peaks lie a
  // third of the way from the H100 NVL's (400 W: FP32 60, TF32 835, BF16 1,671, FP8 3,341
  // "with sparsity") to the H100 SXM's (700 W: 67, 989, 1,979, 3,958).
  const GpuSpec grand_teton = gpu_preset("h100-96");
  EXPECT_EQ(grand_teton.arch, GpuArch::Hopper);
  EXPECT_NEAR(grand_teton.fp32_flops, (60 + 7.0 / 3) * 1e12, 1e3);
  EXPECT_NEAR(grand_teton.peak_flops(Dtype::TF32), (835 + 154.0 / 3) / 2 * 1e12, 1e3);
  EXPECT_NEAR(grand_teton.peak_flops(Dtype::BF16), (1671 + 308.0 / 3) / 2 * 1e12, 1e3);
  EXPECT_NEAR(grand_teton.peak_flops(Dtype::FP8), (3341 + 617.0 / 3) / 2 * 1e12, 1e3);
  EXPECT_NEAR(grand_teton.peak_flops(Dtype::BF16) / gpu_preset("h100").peak_flops(Dtype::BF16),
              0.896, 0.0005);
  EXPECT_DOUBLE_EQ(gpu_preset("h100-96").mem_bw, 2400e9);
  EXPECT_DOUBLE_EQ(gpu_preset("h100-96").mem_bytes, 96e9);
  EXPECT_EQ(parse_cluster_spec("2x8xh100-96").intra.name, "nvlink4");
}

LayerWork block_pass(const char* name, double gemm_flops, double attention_flops) {
  LayerWork w;
  w.layer = name;
  w.op = "matmul";
  w.gemm_flops = gemm_flops;
  w.attention_flops = attention_flops;
  w.flops = gemm_flops + 1e9; // norms and activations
  w.gemm_bytes = 4e9;
  w.bytes = w.gemm_bytes + 2e9;
  w.gemms = 8;
  w.kernels = 14;
  return w;
}

// A bf16 target, and the same with FP8's blocks.
std::pair<PredictOptions, PredictOptions> bf16_and_fp8() {
  PredictOptions bf16;
  bf16.dtype = Dtype::BF16;
  PredictOptions fp8 = bf16;
  fp8.fp8 = true;
  return {bf16, fp8};
}

// A block whose GEMMs are all linear: at fp8, the GEMMs take the FP8 peak at fp8_matmul's
// size-scaled efficiency with one-byte operands, and quantizing them reads and writes their
// bf16 traffic once more, memory bound, one kernel each; the rest is bf16's.
TEST(CostFp8, ABlocksLinearGemmsRunAtTheFp8PeakWithTheirQuantizing) {
  const GpuSpec h100 = gpu_preset("h100");
  const auto [bf16, fp8] = bf16_and_fp8();
  const LayerWork w = block_pass("block3", 8e12, 0);
  const Efficiency e;
  const double gemm_eff = gemm_efficiency(8e12 / 8, 1979e12, [&] {
    Efficiency f = e;
    f.matmul = e.fp8_matmul;
    return f;
  }());
  const double gemm_s = std::max(8e12 / (gemm_eff * 1979e12), 2e9 / (e.memory * 3350e9));
  const double quantize_s = 4e9 / (e.memory * 3350e9); // elementwise: memory bound
  const double rest_s = std::max(1e9 / (e.elementwise * 67e12), 2e9 / (e.memory * 3350e9));
  EXPECT_NEAR(layer_time(w, h100, fp8), gemm_s + quantize_s + rest_s, 1e-12);
  EXPECT_LT(layer_time(w, h100, fp8), layer_time(w, h100, bf16));
  EXPECT_TRUE(runs_in_fp8(w));
}

// The attention core, the embedding and the head stay in bf16.
TEST(CostFp8, TheAttentionCoreTheEmbeddingAndTheHeadStayInBf16) {
  const GpuSpec h100 = gpu_preset("h100");
  const auto [bf16, fp8] = bf16_and_fp8();
  const LayerWork core_only = block_pass("block0", 8e12, 8e12);
  EXPECT_DOUBLE_EQ(layer_time(core_only, h100, fp8), layer_time(core_only, h100, bf16));
  for (const char* name : {"embed", "head", "norm_f"}) {
    const LayerWork w = block_pass(name, 8e12, 0);
    EXPECT_FALSE(runs_in_fp8(w)) << name;
    EXPECT_DOUBLE_EQ(layer_time(w, h100, fp8), layer_time(w, h100, bf16)) << name;
  }
  // Half the GEMMs in the core: the FP8 half is faster, the core's half is bf16's.
  const LayerWork half = block_pass("block1", 8e12, 4e12);
  EXPECT_LT(layer_time(half, h100, fp8), layer_time(half, h100, bf16));
  EXPECT_GT(layer_time(half, h100, fp8), layer_time(block_pass("block1", 8e12, 0), h100, fp8));
}

TrainConfig small_llama(const char* precision, int zero, int tp, int gpus) {
  TrainConfig c;
  c.model = "llama";
  c.data = "synthetic";
  c.device = "meta";
  c.precision = precision;
  c.gpus = gpus;
  c.tp = tp;
  c.zero = zero;
  c.shape.layers = 2;
  c.shape.hidden = 64;
  c.shape.heads = 4;
  c.shape.kv_heads = 2;
  c.shape.seq_len = 32;
  c.shape.vocab = 128;
  c.batch_size = 2;
  c.optimizer.name = "adam";
  c.progress = false;
  validate(c);
  return c;
}

// The block weight matrices one GPU holds: q, k, v, o and the MLP's gate, up and down, split
// over tp as tensor parallelism splits them (their elements divide evenly here).
int64_t block_weight_elements(const TrainConfig& c) {
  const int64_t h = c.shape.hidden, kv = h / c.shape.heads * c.shape.kv_heads;
  const int64_t ffn = 256 * ((8 * h / 3 + 255) / 256); // Meta's rule for the SwiGLU width
  return c.shape.layers * (h * h + 2 * h * kv + h * h + 3 * h * ffn) / c.tp;
}

// An FP8 plan charges exactly 2 bytes a held block-weight element to parameters and 36 bytes
// a GEMM to other, beside bf16's plan; under ZeRO 3 the copies are of its shard (1/dp).
TEST(PlanFp8, ChargesTheFp8CopiesAndScalesBesideBf16) {
  for (const auto& [zero, tp, gpus] : {std::tuple<int, int, int>{0, 1, 2}, {1, 2, 4}, {3, 1, 4}}) {
    const TrainConfig bf16 = small_llama("bf16", zero, tp, gpus);
    const TrainConfig fp8 = small_llama("fp8", zero, tp, gpus);
    const Plan a = make_plan(bf16, kPlanCapacity), b = make_plan(fp8, kPlanCapacity);
    ASSERT_EQ(a.ranks.size(), b.ranks.size());
    const int dp = gpus / tp;
    const int64_t copies = 2 * block_weight_elements(bf16) / (zero >= 3 ? dp : 1);
    const int64_t gemms = bf16.shape.layers * 7;
    const auto at = [](const Plan& p, MemoryCategory cat) {
      return p.ranks[0].stats.peak_by_category[static_cast<size_t>(cat)];
    };
    SCOPED_TRACE("zero " + std::to_string(zero) + " tp " + std::to_string(tp));
    EXPECT_EQ(at(b, MemoryCategory::Parameters) - at(a, MemoryCategory::Parameters), copies);
    EXPECT_EQ(b.ranks[0].model_state_bytes - a.ranks[0].model_state_bytes, copies);
    EXPECT_EQ(at(b, MemoryCategory::Other) - at(a, MemoryCategory::Other),
              gemms * kFp8ScalingBytesPerGemm);
    EXPECT_EQ(at(b, MemoryCategory::Gradients), at(a, MemoryCategory::Gradients));
    EXPECT_EQ(at(b, MemoryCategory::Optimizer), at(a, MemoryCategory::Optimizer));
  }
}

TEST(PlanFp8, PredictsAFasterStepThanBf16OnHopperAndIsRefusedWithoutFp8) {
  // Llama 3 8B's blocks, two of them: GEMMs large enough to be compute bound.
  const auto eight_b = [](const char* precision) {
    TrainConfig c = small_llama(precision, 1, 1, 8);
    c.shape.hidden = 4096;
    c.shape.heads = 32;
    c.shape.kv_heads = 8;
    c.shape.ffn_hidden = 14336;
    c.shape.seq_len = 4096;
    c.shape.vocab = 128256;
    c.batch_size = 1;
    validate(c);
    return c;
  };
  const TrainConfig bf16 = eight_b("bf16"), fp8 = eight_b("fp8");
  const PlanFigures a = plan_on(bf16, parse_cluster_spec("8xh100"));
  const PlanFigures b = plan_on(fp8, parse_cluster_spec("8xh100"));
  EXPECT_LE(b.step_seconds, a.step_seconds);
  EXPECT_DOUBLE_EQ(b.peak_flops, 1979e12); // MFU against the FP8 peak
  try {
    plan_on(fp8, parse_cluster_spec("8xa100"));
    FAIL() << "an FP8 plan on A100s";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a100-80 (Ampere) has none"), std::string::npos)
        << e.what();
  }
}

TEST(CliBadInput, Fp8IsOneLineWhereItCannotRun) {
  for (const char* bad :
       {"train --precision fp8 --max-steps 1", "train --precision fp9",
        "plan --model llama --layers 2 --hidden 64 --heads 4 --seq-len 32 --vocab 128 "
        "--precision fp8 --cluster 4xa100-80 --batch-size 2"}) {
    const auto r = testing::run_meshsim_exactly(bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << bad << ": " << r.output;
  }
  const auto ok = testing::run_meshsim_exactly(
      "plan --model llama --layers 2 --hidden 64 --heads 4 --seq-len 32 --vocab 128 "
      "--precision fp8 --cluster 4xh100 --batch-size 2 --json");
  ASSERT_EQ(ok.code, 0) << ok.output;
}

} // namespace
} // namespace meshsim
