// Plans: a step run on the meta device charges every GPU exactly what a real training run on
// CPU holds, by category, for every layout; the replicas a plan does not run get the executed
// ranks' records under their own ranks.
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "data/text.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "plan/plan.h"
#include "models/gpt.h"
#include "models/presets.h"
#include "train/trainer.h"

namespace meshsim {
namespace {

TEST(ReplicateReplicas, RenamesRanksWithinAReplicaAndKeepsGroupsAcrossThem) {
  // dp 2 × tp 2 × pp 2: a plan runs rank 0 (stage 0) and rank 4 (stage 1).
  const ParallelDims dims = ParallelDims::make(8, 2, 2);
  std::vector<Recorder> executed(8);
  CollectiveRecord tp;
  tp.op = "all_reduce";
  tp.group = {0, 1};
  CollectiveRecord dp;
  dp.op = "all_reduce";
  dp.group = {0, 2};
  CollectiveRecord send;
  send.op = "send";
  send.group = {0, 4};
  send.peer = 4;
  executed[0].collectives = {tp, dp, send};
  executed[0].compute.push_back(ComputeRecord{"forward", 1, 0.0, 1.0});
  const std::vector<Recorder> all = replicate_replicas(executed, dims);
  ASSERT_EQ(all.size(), 8u);
  // Rank 2 is (dp 1, tp 0, pp 0): rank 0's image.
  const Recorder& r2 = all[2];
  ASSERT_EQ(r2.collectives.size(), 3u);
  EXPECT_EQ(r2.collectives[0].group, (std::vector<int>{2, 3}));
  EXPECT_EQ(r2.collectives[1].group, (std::vector<int>{0, 2})); // the dp group spans replicas
  EXPECT_EQ(r2.collectives[2].peer, 6);
  EXPECT_EQ(r2.collectives[2].group, (std::vector<int>{2, 6}));
  ASSERT_EQ(r2.compute.size(), 1u);
  EXPECT_EQ(all[0].collectives[0].group, (std::vector<int>{0, 1}));
  // Rank 1 is (dp 0, tp 1, pp 0): the same tp group, its own dp group, its own next stage.
  const Recorder& r1 = all[1];
  EXPECT_EQ(r1.collectives[0].group, (std::vector<int>{0, 1}));
  EXPECT_EQ(r1.collectives[1].group, (std::vector<int>{1, 3}));
  EXPECT_EQ(r1.collectives[2].peer, 5);
  // Stage 1's GPUs had nothing recorded.
  EXPECT_TRUE(all[5].collectives.empty());
}

struct PlanLayout {
  const char* name;
  int gpus, tp, pp, zero, micro_batches;
  const char* model = "gpt";
  const char* precision = "fp32";
  bool sequence_parallel = false;
  const char* recompute = "none";
  int virtual_stages = 1; // more: interleaved 1F1B over as many more layers
  const char* attention = "fused";
  int64_t seq_len = 0; // 0: the default shape's
  int dp_shard = 0;       // HSDP: ZeRO shards within this many dp ranks (0: all of dp)
  int64_t layers = 0;           // 0: the default, or pp × virtual_stages when more
  const char* stage_layers = ""; // unequal stages (--stage-layers)
  bool tie_head = false;         // with pp: the last stage holds a copy of the embedding
  int cp = 1;
  const char* cp_comm = "allgather";
  double dropout = 0;
};

class PlanMatchesTraining : public ::testing::TestWithParam<PlanLayout> {};

// The same configuration planned on meta tensors and trained on CPU: every executed rank's
// peak bytes of every category are equal (both count the same tensors), with two exceptions
// whose size is known:
//  - `other`: the CPU kernels of the optimizer step convert a Python-number operand (Adam's
//    bias correction) to the dtype of the tensor it updates, float32 (the parameters, or the
//    master weights of mixed precision), in a 0-dim tensor of their own; meta kernels never
//    materialize it. At most one lives at a time, so the CPU run holds at most 4 bytes more.
//  - `communication` with pipeline stages: the in-process backend charges its copy of a
//    message to the sender until the receiver copies it out, so a CPU run holds whatever
//    its threads' timing left in flight; a plan charges none (comm/record_only.h): the CPU
//    run holds at least the plan's bytes, and at most the messages of one step more (each
//    micro-batch's activation, or its gradient, is sent once a step into each chunk).
//    The same holds for context parallelism's ring, whose messages go round every layer.
// The CPU run's bf16 GEMMs run on ATen's own kernels, as on a CPU without AVX-512: with it,
// oneDNN reorders a bf16 GEMM's operands into buffers it takes from the CPU allocator, a
// transient no meta kernel (and no GPU's GEMM) allocates, which is the activation peak
// wherever the peak falls inside a GEMM (docs/memory.md). Turned off for this test only.
TEST_P(PlanMatchesTraining, PeakBytesByCategoryPerGpu) {
  const PlanLayout l = GetParam();
  struct AtenKernels {
    const bool before = at::globalContext().userEnabledMkldnn();
    explicit AtenKernels(bool on) {
      if (on) at::globalContext().setUserEnabledMkldnn(false);
    }
    ~AtenKernels() { at::globalContext().setUserEnabledMkldnn(before); }
  } aten_kernels(std::string(l.precision) == "bf16");
  TrainConfig c;
  c.model = l.model;
  c.precision = l.precision;
  c.recompute = l.recompute;
  c.attention = l.attention;
  if (l.seq_len > 0)
    c.shape.seq_len = l.seq_len;
  c.data = "synthetic";
  c.gpus = l.gpus;
  c.tp = l.tp;
  c.pp = l.pp;
  c.zero = l.zero;
  c.micro_batches = l.micro_batches;
  c.sequence_parallel = l.sequence_parallel;
  c.virtual_stages = l.virtual_stages;
  c.dp_shard = l.dp_shard;
  c.cp = l.cp;
  c.cp_comm = l.cp_comm;
  c.dropout = l.dropout;
  c.shape.layers = std::max<int64_t>(c.shape.layers, static_cast<int64_t>(l.pp) * l.virtual_stages);
  if (l.layers > 0) c.shape.layers = l.layers;
  c.stage_layers = l.stage_layers;
  c.shape.tie_head = l.tie_head;
  c.batch_size = 8;
  c.max_steps = kPlanSteps;
  c.synthetic_train = 256;
  c.synthetic_test = 16;
  c.eval_limit = 16;
  c.progress = false;
  validate(c);

  const Plan plan = make_plan(c, int64_t{1} << 40);

  MeshOptions mo;
  mo.world_size = c.gpus;
  mo.capacity_bytes = int64_t{1} << 32;
  DeviceMesh mesh(mo);
  const DataSplit data =
      synthetic_text(c.synthetic_train, c.synthetic_test, c.shape.seq_len, c.shape.vocab, c.seed);
  train(c, mesh, data, nullptr);

  // One activation message between stages: a micro-batch of [B/M, T, H] in the compute dtype
  // (a tp member sends its own copy; under sequence parallelism, its part [B/M, T/tp, H]).
  const int64_t element = c.precision == "fp32" ? 4 : 2;
  const int64_t tokens = c.sequence_parallel ? c.shape.seq_len / c.tp : c.shape.seq_len;
  const int64_t message = c.batch_size / c.micro_batches * tokens * c.shape.hidden * element;
  const auto at = [](const MemoryStats& s, MemoryCategory k) {
    return s.peak_by_category[static_cast<size_t>(k)];
  };
  // Every GPU of the CPU run against the plan's rank for its stage: the GPUs a plan does not
  // run are, as it assumes, images of the one it ran.
  ASSERT_EQ(plan.ranks.size(), static_cast<size_t>(c.pp));
  const ParallelDims dims = ParallelDims::make(c.gpus, c.tp, c.pp, c.cp);
  const bool ring = c.cp > 1 && std::string(c.cp_comm) == "ring";
  for (int r = 0; r < c.gpus; ++r) {
    const PlannedRank& p = plan.ranks[static_cast<size_t>(dims.coord(r).pp)];
    const MemoryStats real = mesh.gpu(r).stats();
    const std::string where = std::string(l.name) + ": gpu" + std::to_string(r) + " ";
    for (int k = 0; k < kNumCategories; ++k) {
      const auto cat = static_cast<MemoryCategory>(k);
      if (cat == MemoryCategory::Other ||
          (cat == MemoryCategory::Communication && (c.pp > 1 || ring)))
        continue;
      EXPECT_EQ(at(p.stats, cat), at(real, cat)) << where << category_name(cat);
    }
    const int64_t other = at(real, MemoryCategory::Other) - at(p.stats, MemoryCategory::Other);
    EXPECT_GE(other, 0) << where << "other";
    EXPECT_LE(other, 4) << where << "other";
    if (ring) { // the ring's messages in flight: at least the plan's bytes
      EXPECT_GE(at(real, MemoryCategory::Communication),
                at(p.stats, MemoryCategory::Communication))
          << where << "communication";
    }
    if (c.pp > 1 && !ring) {
      const int64_t ahead = at(real, MemoryCategory::Communication) -
                            at(p.stats, MemoryCategory::Communication);
      EXPECT_GE(ahead, 0) << where << "communication";
      EXPECT_LE(ahead, c.micro_batches * c.virtual_stages * message) << where << "communication";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlanMatchesTraining,
                         ::testing::Values(PlanLayout{"ddp", 4, 1, 1, 0, 1},
                                           PlanLayout{"zero3", 4, 1, 1, 3, 1},
                                           PlanLayout{"tp2", 4, 2, 1, 0, 1},
                                           PlanLayout{"pp2_1f1b", 4, 1, 2, 0, 4},
                                           PlanLayout{"mesh_2x2x2_zero1", 8, 2, 2, 1, 2},
                                           PlanLayout{"bf16_zero3", 4, 1, 1, 3, 1, "gpt", "bf16"},
                                           // bf16 without ZeRO: the replicas' own models, drawn
                                           // in float32 on the host and converted
                                           PlanLayout{"bf16_ddp", 2, 1, 1, 0, 1, "llama", "bf16"},
                                           PlanLayout{"llama_mesh_2x2x2", 8, 2, 2, 1, 2, "llama"},
                                           PlanLayout{"tp2_sequence_parallel", 4, 2, 1, 0, 1, "gpt",
                                                  "fp32", true},
                                           PlanLayout{"mesh_2x2x2_zero1_sequence_parallel", 8, 2, 2,
                                                  1, 2, "llama", "fp32", true},
                                           PlanLayout{"selective_tp2_zero1_bf16", 4, 2, 1, 1, 2,
                                                  "gpt", "bf16", false, "selective"},
                                           PlanLayout{"llama_selective_pp2", 4, 1, 2, 0, 4, "llama",
                                                  "fp32", false, "selective"},
                                           PlanLayout{"pp2_interleaved", 4, 1, 2, 0, 4, "gpt", "fp32",
                                                  false, "none", 2},
                                           PlanLayout{"mesh_2x2x2_zero1_interleaved", 8, 2, 2, 1, 2,
                                                  "llama", "fp32", false, "none", 2},
                                           PlanLayout{"eager_ddp", 4, 1, 1, 0, 1, "gpt", "fp32",
                                                  false, "none", 1, "eager"},
                                           PlanLayout{"eager_selective_tp2_zero1_bf16", 4, 2, 1, 1,
                                                  2, "gpt", "bf16", false, "selective", 1, "eager"},
                                           PlanLayout{"eager_llama_selective_pp2", 4, 1, 2, 0, 4,
                                                  "llama", "fp32", false, "selective", 1, "eager"},
                                           // 320 tokens: query tiles of 128, 128 and 64 on CPU;
                                           // a plan runs the first (fused_core.cpp)
                                           PlanLayout{"fused_three_tiles_llama_bf16_zero3", 2, 1, 1,
                                                  3, 1, "llama", "bf16", false, "none", 1, "fused",
                                                  320},
                                           PlanLayout{"mesh_2x2x2_zero3", 8, 2, 2, 3, 2},
                                           PlanLayout{"mesh_2x2x2_zero2_sequence_parallel", 8, 2, 2,
                                                  2, 2, "gpt", "fp32", true},
                                           PlanLayout{"hsdp_zero3", 4, 1, 1, 3, 2, "gpt", "fp32",
                                                  false, "none", 1, "fused", 0, 2},
                                           PlanLayout{"hsdp_tp2_zero3", 8, 2, 1, 3, 1, "gpt",
                                                  "fp32", false, "none", 1, "fused", 0, 2},
                                           PlanLayout{"pp2_unequal_tied", 2, 1, 2, 0, 2, "gpt",
                                                  "fp32", false, "none", 1, "fused", 0, 0, 5, "1,4", true},
                                           PlanLayout{"dp2_pp3_unequal_zero1", 6, 1, 3, 1, 2,
                                                  "llama", "fp32", false, "none", 1, "fused", 0, 0, 5, "2,1,2"},
                                           PlanLayout{"tp2_pp2_interleaved_unequal_tied", 4,
                                                  2, 2, 1, 2, "gpt", "fp32", false, "none", 2, "fused", 0, 0,
                                                  5, "1,2,1,1", true},
                                           PlanLayout{"cp2_dp2_allgather", 4, 1, 1, 0, 1, "gpt",
                                                  "fp32", false, "none", 1, "fused", 0, 0, 0, "", false, 2, "allgather"},
                                           PlanLayout{"llama_cp2_ring_zero1", 4, 1, 1, 1, 1,
                                                  "llama", "fp32", false, "none", 1, "fused", 0, 0, 0, "", false, 2, "ring"},
                                           PlanLayout{"llama_cp2_tp2_sp_pp2_ring", 8, 2, 2, 1, 2,
                                                  "llama", "fp32", true, "none", 1, "fused", 0, 0, 0, "", false, 2, "ring"},
                                           // Dropout: the fused core's per-tile masks are
                                           // transients, the eager core's mask is kept, and the
                                           // hidden dropouts' masks are kept on every layout.
                                           PlanLayout{"dropout_fused_three_tiles_llama_bf16_zero1", 2, 1,
                                                  1, 1, 1, "llama", "bf16", false, "none", 1, "fused",
                                                  320, 0, 0, "", false, 1, "allgather", 0.1},
                                           PlanLayout{"dropout_eager_selective_tp2_zero1_bf16", 4, 2,
                                                  1, 1, 2, "gpt", "bf16", false, "selective", 1, "eager",
                                                  0, 0, 0, "", false, 1, "allgather", 0.1},
                                           PlanLayout{"dropout_llama_cp2_tp2_sp_pp2_ring", 8, 2, 2,
                                                  1, 2, "llama", "fp32", true, "none", 1, "fused", 0, 0,
                                                  0, "", false, 2, "ring", 0.1},
                                           PlanLayout{"dropout_gpt_cp2_dp2_allgather_zero3", 4, 1,
                                                  1, 3, 1, "gpt", "fp32", false, "none", 1, "fused", 0, 0,
                                                  0, "", false, 2, "allgather", 0.1}),
                         [](const auto& info) { return std::string(info.param.name); });

// Unequal stages in a plan: every stage runs, and moving blocks between stages moves exactly
// their parameters' bytes. A GPT of 5 blocks on 2 stages as 1,4 and as 4,1 (fp32, dp 1: the
// flat buffers have no padding): stage 0's parameters grow by 3 blocks, stage 1's shrink by
// as many; a block holds gpt_parameter_count(2 layers) - gpt_parameter_count(1 layer)
// parameters. Tied, the last stage's copy of the embedding is charged there: V·H, what an
// untied head's weight costs, so each stage holds what the untied model's does.
TEST(Plan, UnequalStagesMoveBlocksBetweenStages) {
  auto planned = [](const char* stage_layers, bool tie_head) {
    TrainConfig c;
    c.model = "gpt";
    c.data = "synthetic";
    c.gpus = 2;
    c.pp = 2;
    c.micro_batches = 2;
    c.batch_size = 4;
    c.shape.layers = 5;
    c.shape.tie_head = tie_head;
    c.stage_layers = stage_layers;
    validate(c);
    const Plan plan = make_plan(c, int64_t{1} << 40);
    std::vector<int64_t> params;
    for (const PlannedRank& r : plan.ranks)
      params.push_back(r.stats.peak_by_category[static_cast<size_t>(MemoryCategory::Parameters)]);
    return std::make_pair(c.shape, params);
  };
  const auto [shape, front] = planned("4,1", false);
  const auto back = planned("1,4", false).second;
  ASSERT_EQ(front.size(), 2u);
  ASSERT_EQ(back.size(), 2u);
  TransformerShape one = shape, two = shape;
  one.layers = 1;
  two.layers = 2;
  const int64_t block_bytes = 4 * (gpt_parameter_count(two) - gpt_parameter_count(one));
  EXPECT_EQ(front[0] - back[0], 3 * block_bytes);
  EXPECT_EQ(back[1] - front[1], 3 * block_bytes);
  // The tied model: the head's copy on the last stage is V·H floats, as an untied head's
  // weight is; the first stage is unchanged.
  const auto tied = planned("1,4", true).second;
  EXPECT_EQ(tied[0], back[0]);
  EXPECT_EQ(tied[1], back[1]);
  std::cout << "stage parameters, 4,1: " << front[0] << " / " << front[1] << " B; 1,4: " << back[0]
            << " / " << back[1] << " B; a block " << block_bytes << " B\n";
}

} // namespace
} // namespace meshsim

namespace meshsim {
namespace {

// The activation bytes of one transformer layer, as a plan counts them: the peak with L + 1
// layers less the peak with L (one GPU, so nothing else changes). Korthikanti et al. 2022
// count sbh(34 + 5as/h) bytes per layer in 16-bit training with dropout. meshsim's GPT has
// no dropout, which removes the two sbh-byte dropout masks (attention output and MLP
// output) and, in the attention core, the as²b-byte dropout mask and the 2as²b-byte dropout
// output: 32sbh + 2as²b. It keeps two things the paper leaves out: the causal mask
// masked_fill saves for backward, s² bytes of bool, and the mean and rstd of its two
// LayerNorms, 4 tensors of sb bf16 values, 8sb bytes. With full recompute a layer keeps
// only its input, 2sbh bytes, the paper's number. With tensor parallel t the paper's
// sbh(10 + 24/t + 5as/(ht)) loses the same dropout terms, the replicated masks (2sbh) among
// them: 8sbh + 24sbh/t + 2as²b/t, plus the same causal mask and LayerNorm statistics, which
// every member keeps whole. Selective recompute checkpoints the attention core, whose only
// kept tensors were the softmax output (2as²b/t) and the causal mask (s²): what remains is
// 32sbh + 8sb, or 8sbh + 24sbh/t + 8sb under tensor parallel t, the paper's 34sbh and
// sbh(10 + 24/t) less the same two dropout masks (the checkpoint keeps q, k and v, the 6sbh/t
// the paper counts for QKᵀ and for V).
struct LayerShape {
  int64_t s = 512, b = 2, h = 256, a = 8, vocab = 1024;
};

int64_t activation_bytes_per_layer(const std::string& recompute, int tp = 1,
                                   const LayerShape& shape = {},
                                   const std::string& attention = "eager") {
  auto peak = [&](int64_t layers) {
    TrainConfig c;
    c.attention = attention;
    c.model = "gpt";
    c.data = "synthetic";
    c.gpus = tp;
    c.tp = tp;
    c.precision = "bf16";
    c.recompute = recompute;
    c.batch_size = shape.b;
    c.shape.layers = layers;
    c.shape.hidden = shape.h;
    c.shape.heads = shape.a;
    c.shape.seq_len = shape.s;
    c.shape.vocab = shape.vocab;
    validate(c);
    const Plan plan = make_plan(c, int64_t{1} << 40);
    return plan.ranks.front()
        .stats.peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
  };
  return peak(3) - peak(2);
}

TEST(PlanActivations, PerLayerBytesAreKorthikantisFormulaWithoutDropout) {
  const int64_t s = 512, b = 2, h = 256, a = 8;
  EXPECT_EQ(activation_bytes_per_layer("none"), 32 * s * b * h + 2 * a * s * s * b + s * s + 8 * s * b);
}

TEST(PlanActivations, TensorParallelPerLayerBytesAreKorthikantisFormulaWithoutDropout) {
  const int64_t s = 512, b = 2, h = 256, a = 8, t = 2;
  EXPECT_EQ(activation_bytes_per_layer("none", 2),
            8 * s * b * h + 24 * s * b * h / t + 2 * a * s * s * b / t + s * s + 8 * s * b);
}

TEST(PlanActivations, FullRecomputeKeepsTwoSbhPerLayer) {
  const int64_t s = 512, b = 2, h = 256;
  EXPECT_EQ(activation_bytes_per_layer("full"), 2 * s * b * h);
}

// |got - want| / want, printed beside the paper's own formula.
double relative_to(int64_t got, double want) {
  return std::abs(static_cast<double>(got) - want) / want;
}

TEST(PlanActivations, SelectiveRecomputeKeepsAllButTheAttentionCore) {
  const int64_t s = 512, b = 2, h = 256;
  const int64_t got = activation_bytes_per_layer("selective");
  EXPECT_EQ(got, 32 * s * b * h + 8 * s * b);
  const double paper = 34.0 * s * b * h, without_dropout = paper - 2.0 * s * b * h;
  EXPECT_LT(relative_to(got, without_dropout), 0.02);
  std::cout << "selective, s=" << s << " b=" << b << " h=" << h << ": " << got
            << " B per layer; 34sbh = " << paper << " (" << 100 * relative_to(got, paper)
            << "% off), less its dropout masks " << without_dropout << " ("
            << 100 * relative_to(got, without_dropout) << "% off)\n";
}

TEST(PlanActivations, TensorParallelSelectiveRecomputeIsKorthikantisFormulaWithoutDropout) {
  const int64_t s = 512, b = 2, h = 256, t = 2;
  const int64_t got = activation_bytes_per_layer("selective", 2);
  EXPECT_EQ(got, 8 * s * b * h + 24 * s * b * h / t + 8 * s * b);
  const double paper = s * b * h * (10.0 + 24.0 / t), without_dropout = paper - 2.0 * s * b * h;
  EXPECT_LT(relative_to(got, without_dropout), 0.02);
}

// The fused attention core keeps, of the attention core, q, k and v (the eager core's matmuls
// keep copies of the same 6sbh; the fused one keeps the projections' outputs), its output (the
// tensor the output projection keeps: the core writes it as [b, s, a, d], so the reshape to
// [b, s, h] is no copy), one float32 log-sum-exp per row and head, 4asb, and the int64
// positions it rebuilds the causal mask from, 8s; not the softmax (2as²b) nor the mask (s²).
// A bf16 GPT layer keeps 32sbh + 4asb + 8sb + 8s bytes (docs/planning.md), and with tensor
// parallel t 8sbh + 24sbh/t + 4asb/t + 8sb + 8s (every member holds the whole positions and
// the LayerNorms' statistics). Selective recompute leaves a fused core alone: the same bytes.
int64_t fused_bytes_per_layer(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t = 1) {
  return 8 * s * b * h + 24 * s * b * h / t + 4 * a * s * b / t + 8 * s * b + 8 * s;
}

TEST(PlanActivations, FusedAttentionKeepsNoScores) {
  const int64_t s = 512, b = 2, h = 256, a = 8;
  EXPECT_EQ(activation_bytes_per_layer("none", 1, {}, "fused"), fused_bytes_per_layer(s, b, h, a));
  EXPECT_EQ(activation_bytes_per_layer("none", 2, {}, "fused"),
            fused_bytes_per_layer(s, b, h, a, 2));
  EXPECT_EQ(activation_bytes_per_layer("selective", 1, {}, "fused"),
            fused_bytes_per_layer(s, b, h, a));
  EXPECT_EQ(activation_bytes_per_layer("full", 1, {}, "fused"), 2 * s * b * h);
}

// Op-level recompute (torchtitan's) keeps a block's input (2sbh in bf16), the outputs of q, v
// (2sbh each), fc (8sbh) and proj (2sbh), and the fused core's output (2sbh) and log-sum-exp
// (4asb): 18sbh + 4asb a layer, where PyTorch's selective checkpointing keeps the same. With
// the eager core nothing of the core is kept: 16sbh. (It needs --tp 1: CliMesh.BadLayouts...)
TEST(PlanActivations, OpRecomputeKeepsTheInputEveryOtherMatmulAndTheFusedCore) {
  const int64_t s = 512, b = 2, h = 256, a = 8;
  EXPECT_EQ(activation_bytes_per_layer("op", 1, {}, "fused"), 18 * s * b * h + 4 * a * s * b);
  EXPECT_EQ(activation_bytes_per_layer("op", 1, {}, "eager"), 16 * s * b * h);
}

// The same formula on a real CPU run (the peak of the activations with 3 layers less that with
// 2), over a sequence of 136 tokens: query tiles of 128 and 8 rows.
TEST(PlanActivations, FusedAttentionOnACpuRunKeepsTheFormulasBytes) {
  const int64_t s = 136, b = 1, h = 32, a = 2;
  auto peak = [&](int64_t layers) {
    TrainConfig c;
    c.model = "gpt";
    c.attention = "fused";
    c.data = "synthetic";
    c.gpus = 1;
    c.precision = "bf16";
    c.batch_size = b;
    c.shape.layers = layers;
    c.shape.hidden = h;
    c.shape.heads = a;
    c.shape.seq_len = s;
    c.max_steps = 1;
    c.synthetic_train = 8;
    c.synthetic_test = 2;
    c.eval_limit = 2;
    c.progress = false;
    validate(c);
    MeshOptions mo;
    mo.world_size = 1;
    mo.capacity_bytes = int64_t{1} << 32;
    DeviceMesh mesh(mo);
    train(c, mesh, synthetic_text(8, 2, s, c.shape.vocab, c.seed), nullptr);
    return mesh.gpu(0).stats().peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
  };
  EXPECT_EQ(peak(3) - peak(2), fused_bytes_per_layer(s, b, h, a));
}

// The same at the size the paper measured: the 22B GPT of its Table 3 (h 6144, 64 heads,
// s 2048), one sequence per micro-batch, planned with 2 and 3 of its layers.
TEST(PlanActivations, SelectiveRecomputeAtTheSizeOfGpt22b) {
  const ModelPreset* preset = find_preset("gpt-22b");
  ASSERT_NE(preset, nullptr);
  LayerShape shape;
  shape.s = preset->shape.seq_len;
  shape.h = preset->shape.hidden;
  shape.a = preset->shape.heads;
  shape.b = 1;
  shape.vocab = preset->shape.vocab;
  const int64_t s = shape.s, b = shape.b, h = shape.h, a = shape.a;
  const int64_t none = activation_bytes_per_layer("none", 1, shape);
  const int64_t selective = activation_bytes_per_layer("selective", 1, shape);
  EXPECT_EQ(none, 32 * s * b * h + 2 * a * s * s * b + s * s + 8 * s * b);
  EXPECT_EQ(selective, 32 * s * b * h + 8 * s * b);
  const double paper = 34.0 * s * b * h, without_dropout = paper - 2.0 * s * b * h;
  EXPECT_LT(relative_to(selective, without_dropout), 0.02);
  std::cout << "gpt-22b layer, b=1: " << none << " B without recompute, " << selective
            << " B selective; 34sbh = " << paper << " (" << 100 * relative_to(selective, paper)
            << "% off), less its dropout masks " << without_dropout << " ("
            << 100 * relative_to(selective, without_dropout) << "% off)\n";
}

} // namespace
} // namespace meshsim

namespace meshsim {
namespace {

// The ZeRO paper's Table 1 (Rajbhandari et al. 2020): model-state bytes per GPU with fp16 mixed
// precision and Adam are 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N for stages 0-3 (for Ψ = 7.5B
// at N = 64: 120, 31.4, 16.6 and 1.88 GB). Planned for Narayanan et al.'s 7.5B GPT with an
// untied head (stage 3 does not take a tied one yet), whose every flat unit divides by 64 and
// by 1,024, so no padding enters: the formulas hold to the byte.
TEST(PlanZeroPaper, ModelStateBytesPerGpuAreTheFourFormulas) {
  const ModelPreset* preset = find_preset("gpt-7.5b");
  ASSERT_NE(preset, nullptr);
  for (int n : {64, 1024}) {
    for (int stage = 0; stage <= 3; ++stage) {
      TrainConfig c;
      c.model = "gpt";
      c.data = "synthetic";
      c.shape = preset->shape;
      c.shape.tie_head = false;
      c.shape.seq_len = 16; // activations do not enter model state; keep the plan quick
      c.gpus = n;
      c.zero = stage;
      c.precision = "fp16"; // the paper's: planned on the meta device, which no CPU can train
      c.device = "meta";
      c.batch_size = 1;
      validate(c);
      const int64_t psi = preset_parameter_count("gpt", c.shape);
      const int64_t expected[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n,
                                  16 * psi / n};
      ASSERT_EQ(psi % n, 0);
      const Plan plan = make_plan(c, int64_t{1} << 50);
      EXPECT_EQ(plan.ranks.front().model_state_bytes, expected[stage])
          << "N = " << n << ", stage " << stage;
    }
  }
}

// --reduce-fp32 under ZeRO 1 (Megatron's fp32 main_grad, its distributed optimizer): the
// gradients are fp32, so model state is 2Ψ + 4Ψ + 12Ψ/N, not the paper's 4Ψ + 12Ψ/N. With
// tensor and sequence parallelism the partial gradients of the norms are summed over tp from
// the fp32 gradient, and the gradients stay twice the bf16 parameters' bytes.
TEST(PlanZeroPaper, Zero1ReducedInFp32HoldsFp32Gradients) {
  const ModelPreset* preset = find_preset("gpt-7.5b");
  ASSERT_NE(preset, nullptr);
  for (int tp : {1, 2}) {
    TrainConfig c;
    c.model = "gpt";
    c.data = "synthetic";
    c.shape = preset->shape;
    c.shape.tie_head = false;
    c.shape.seq_len = 16;
    c.gpus = 64;
    c.tp = tp;
    c.sequence_parallel = tp > 1;
    c.zero = 1;
    c.distributed_optimizer = true;
    c.reduce_fp32 = true;
    c.precision = "bf16";
    c.device = "meta";
    c.batch_size = 1;
    validate(c);
    const Plan plan = make_plan(c, int64_t{1} << 50);
    const MemoryStats& m = plan.ranks.front().stats;
    const int64_t params = m.peak_by_category[static_cast<size_t>(MemoryCategory::Parameters)];
    const int64_t grads = m.peak_by_category[static_cast<size_t>(MemoryCategory::Gradients)];
    EXPECT_EQ(grads, 2 * params) << "tp " << tp;
    if (tp == 1) {
      const int64_t psi = preset_parameter_count("gpt", c.shape);
      ASSERT_EQ(psi % c.gpus, 0);
      EXPECT_EQ(plan.ranks.front().model_state_bytes, 6 * psi + 12 * psi / c.gpus);
    }
  }
}

} // namespace
} // namespace meshsim

namespace meshsim {
namespace {

// A configuration whose plan executes one GPU per stage: `shape` in bf16 on tp GPUs.
TrainConfig tensor_parallel_config(const TransformerShape& shape, int tp, int64_t batch,
                                   bool sequence_parallel, const std::string& recompute = "none") {
  TrainConfig c;
  c.attention = "eager"; // the formulas below are the eager core's
  c.recompute = recompute;
  c.model = "gpt";
  c.data = "synthetic";
  c.shape = shape;
  c.gpus = tp;
  c.tp = tp;
  c.sequence_parallel = sequence_parallel;
  c.precision = "bf16";
  c.batch_size = batch;
  validate(c);
  return c;
}

// Activation bytes of one layer: the peak with `layers` + 1 layers less the peak with
// `layers`. The peak must come while every layer's activations are held (at the loss): with a
// real vocabulary, the end of backward holds the embedding's [V, h] gradients, so real widths
// need enough layers to outweigh them.
int64_t sequence_parallel_bytes_per_layer(TransformerShape shape, int tp, int64_t batch,
                                          int64_t layers = 2,
                                          const std::string& recompute = "none") {
  auto peak = [&](int64_t n) {
    shape.layers = n;
    const Plan plan =
        make_plan(tensor_parallel_config(shape, tp, batch, true, recompute), int64_t{1} << 50);
    return plan.ranks.front()
        .stats.peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
  };
  return peak(layers + 1) - peak(layers);
}

// meshsim's exact bytes per layer under sequence parallelism, bf16. Every tensor a block keeps
// is its share of the sequence, sbh/t · 2 bytes per [s/t, b, h]: the block's output and the
// residual after attention (the LayerNorms' inputs, 2 + 2), the LayerNorms' outputs, kept by
// the column layers as their input instead of the gathered whole (2 + 2), q, k, v (6), the
// attention output (2), the MLP's 4h-wide GELU input and output (8 + 8): 32sbh/t. The
// attention core keeps its softmax, 2as²b/t, and the causal mask, s² bytes of bool whole on
// every member (attention runs on the gathered sequence); the LayerNorms' mean and rstd are
// 8sb/t. Against Korthikanti et al.'s sbh/t · (34 + 5as/h), the difference is the dropout
// the GPT does not have (its two sbh masks, and in the attention core the as²b mask and the
// 2as²b output, all divided by t) and the mask and statistics the paper leaves out.
int64_t expected_sequence_parallel_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t) {
  return 32 * s * b * h / t + 2 * a * s * s * b / t + s * s + 8 * s * b / t;
}

// The layer the sequence-parallel tests plan: h 256, 8 heads, s 512, vocabulary 1,024.
TransformerShape small_layer() {
  TransformerShape shape;
  shape.hidden = 256;
  shape.heads = 8;
  shape.seq_len = 512;
  shape.vocab = 1024;
  return shape;
}

TEST(PlanActivations, SequenceParallelPerLayerBytesAreKorthikantisFormulaWithoutDropout) {
  const TransformerShape shape = small_layer();
  const int64_t s = 512, b = 2, h = 256, a = 8, t = 2;
  EXPECT_EQ(sequence_parallel_bytes_per_layer(shape, t, b),
            expected_sequence_parallel_bytes(s, b, h, a, t));
}

// With full recompute a block keeps only its input, which is this member's part: 2sbh/t.
TEST(PlanActivations, SequenceParallelWithFullRecomputeKeepsTheInputsPart) {
  const TransformerShape shape = small_layer();
  const int64_t s = 512, b = 2, h = 256, t = 2;
  EXPECT_EQ(sequence_parallel_bytes_per_layer(shape, t, b, 2, "full"), 2 * s * b * h / t);
}

// Selective recompute with sequence parallelism, Korthikanti et al.'s 34sbh/t: the attention
// core is recomputed, so neither its softmax (2as²b/t) nor the causal mask (s²) is kept, and
// what remains is the layer above less those, 32sbh/t + 8sb/t: the paper's 34sbh/t less its
// two dropout masks (2sbh/t), plus the LayerNorms' statistics.
TEST(PlanActivations, SequenceParallelWithSelectiveRecomputeIsThirtyFourSbhOverT) {
  const TransformerShape shape = small_layer();
  const int64_t s = 512, b = 2, h = 256, t = 2;
  const int64_t got = sequence_parallel_bytes_per_layer(shape, t, b, 2, "selective");
  EXPECT_EQ(got, 32 * s * b * h / t + 8 * s * b / t);
  const double paper = 34.0 * s * b * h / t, without_dropout = paper - 2.0 * s * b * h / t;
  EXPECT_LT(relative_to(got, without_dropout), 0.02);
}

// The models of Korthikanti et al. 2022's Table 3, at their tensor-parallel size (8), their
// sequence (2,048) and a micro-batch of 1, planned with 32 and 33 layers: meshsim's bytes per layer
// are its formula exactly; against the paper's sbh/t · (34 + 5as/h) with its dropout terms
// taken out, sbh/t · (32 + 2as/h), what remains is the causal mask (s², which sequence
// parallelism does not split) and the LayerNorms' statistics: within 2 % where the mask is
// small next to a layer's share (530B, 1T), 2.1 % for 175B and 3.6 % for 22B.
TEST(PlanActivations, SequenceParallelAtThePapersModels) {
  const int64_t s = 2048, b = 1, t = 8;
  for (const char* name : {"gpt-22b", "gpt-175b", "gpt-530b", "gpt-1t"}) {
    const ModelPreset* preset = find_preset(name);
    ASSERT_NE(preset, nullptr) << name;
    const int64_t h = preset->shape.hidden, a = preset->shape.heads;
    ASSERT_EQ(preset->shape.seq_len, s) << name;
    const int64_t got = sequence_parallel_bytes_per_layer(preset->shape, t, b, /*layers=*/32);
    EXPECT_EQ(got, expected_sequence_parallel_bytes(s, b, h, a, t)) << name;
    const double paper = static_cast<double>(s * b * h) / t * (34.0 + 5.0 * a * s / h);
    const double without_dropout = static_cast<double>(s * b * h) / t * (32.0 + 2.0 * a * s / h);
    const double over = static_cast<double>(got) / without_dropout - 1;
    std::cout << name << ": " << got << " bytes per layer; paper " << paper << ", without dropout "
              << without_dropout << " (meshsim " << 100 * over << " % above: the causal mask "
              << s * s << " bytes)\n";
    if (std::string(name) == "gpt-530b" || std::string(name) == "gpt-1t") {
      EXPECT_LT(over, 0.02) << name;
    }
  }
}

// Per step, on a tp group of 2: without sequence parallelism, 4 all-reduces per layer of the
// [b, s, h] activation (2 forward at the row layers' outputs, 2 backward at the column layers'
// inputs). With it, none of those: per layer 2 reduce-scatters forward (row outputs) and 2
// backward (column inputs' gradients), of the whole [b, s, h]; 2 all-gathers forward (column
// inputs), 2 backward (row outputs' gradients) and 2 backward again (the column inputs, kept
// as this member's part, gathered for the weights' gradients), of the part [b, s/2, h]; plus
// the embedding's output gradient and the head's input, gathered once each; and one all-reduce
// of the partial parameters' gradients (per block 2 LayerNorms and 2 row biases, 6h, and ln_f,
// 2h). Both ways, the head (untied, split over the vocabulary) all-reduces its input's
// gradient, the whole [b, s, h], and keeps its logits [b, s, V/2] split: the vocab-parallel
// loss all-reduces three fp32 values a token (the max, the target's logit, the sum of exps).
TEST(PlanSequenceParallel, TheTpGroupReduceScattersAndAllGathersInsteadOfAllReducing) {
  const int64_t layers = 2, b = 2, s = 64, h = 64, e = 2;
  TransformerShape shape;
  shape.layers = layers;
  shape.hidden = h;
  shape.heads = 4;
  shape.seq_len = s;
  for (bool sequence_parallel : {false, true}) {
    TrainConfig c = tensor_parallel_config(shape, 2, b, sequence_parallel);
    c.gpus = 4; // dp 2: the tp group [0, 1] is neither the world nor a dp group
    validate(c);
    const Plan plan = make_plan(c, int64_t{1} << 40);
    std::map<std::string, int64_t> count;
    std::map<std::string, std::set<int64_t>> sizes;
    for (const CollectiveRecord& r : plan.recorders[0].collectives) {
      if (r.group != std::vector<int>{0, 1})
        continue;
      count[r.op] += 1;
      sizes[r.op].insert(r.bytes);
    }
    const int64_t steps = plan.steps, whole = b * s * h * e;
    const int64_t per_token = b * s * 4; // the loss's fp32 value a token
    const std::string where = sequence_parallel ? "sequence parallel" : "tensor parallel";
    if (!sequence_parallel) {
      // + the embedding's sum of the members' lookups (split over the vocabulary).
      EXPECT_EQ(count["all_reduce"], steps * (4 * layers + 2 + 3)) << where;
      EXPECT_EQ(sizes["all_reduce"], (std::set<int64_t>{per_token, whole})) << where;
      EXPECT_EQ(count["reduce_scatter"], 0) << where;
      EXPECT_EQ(count["all_gather"], 0) << where;
      continue;
    }
    EXPECT_EQ(count["reduce_scatter"], steps * 4 * layers) << where;
    EXPECT_EQ(sizes["reduce_scatter"], std::set<int64_t>{whole}) << where;
    EXPECT_EQ(count["all_gather"], steps * (6 * layers + 2)) << where;
    EXPECT_EQ(sizes["all_gather"], std::set<int64_t>{whole / 2}) << where;
    EXPECT_EQ(count["all_reduce"], 3 * steps + 3 * steps) << where; // the embedding's too
    EXPECT_EQ(sizes["all_reduce"],
              (std::set<int64_t>{per_token, (6 * h * layers + 2 * h) * e, whole}))
        << where;
  }
}

} // namespace
} // namespace meshsim

namespace meshsim {
namespace {

// A plan's clock measures only how fast the host dispatched meta operations; the prediction
// must not depend on it. Tensor parallelism puts all-reduces inside forward and backward, and a
// pipeline makes the pieces' lengths matter to the other stage.
TEST(PlanPrediction, TheSameLayoutPredictsTheSameStepEveryRun) {
  TrainConfig c;
  c.model = "gpt";
  c.data = "synthetic";
  c.gpus = 8;
  c.tp = 2;
  c.pp = 2;
  c.micro_batches = 4;
  c.batch_size = 8;
  c.shape.layers = 4;
  c.shape.hidden = 256;
  c.shape.heads = 8;
  c.shape.seq_len = 256;
  c.device = "meta";
  c.progress = false;
  validate(c);
  const ClusterSpec cluster = parse_cluster_spec("8xa100-80");
  const double first = plan_on(c, cluster).step_seconds;
  EXPECT_GT(first, 0);
  for (int run = 0; run < 4; ++run)
    EXPECT_EQ(plan_on(c, cluster).step_seconds, first) << "run " << run + 2;
}

} // namespace
} // namespace meshsim
