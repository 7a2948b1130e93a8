// The H100 training rows of `meshsim validate`: what each source published, the configuration
// it names (or what meshsim assumes where it names none, said beside the row), and how the row
// is predicted. Sources, software versions and the calibration split: docs/cost-model.md.
#include <cmath>

#include <fmt/format.h>

#include "config/config.h"
#include "plan/estimate.h"
#include "plan/plan.h"
#include "plan/validation_rows.h"

namespace meshsim {
namespace {

enum class Unit { TokensPerGpu, MegatronTflops };

const char* unit_name(Unit unit) {
  return unit == Unit::TokensPerGpu ? "tokens/s per GPU" : "TFLOP/s per GPU";
}

// A run's mesh and batch: dp is what tp · pp · cp leave of the GPUs.
struct Layout {
  int gpus = 8;
  int tp = 1, pp = 1, virtual_stages = 1, cp = 1, ep = 1;
  int zero = 1; // Megatron's distributed optimizer is ZeRO 1 (planned as it runs), FSDP is ZeRO 3
  int64_t global_batch = 0, micro_batch = 1;
  std::string stage_layers; // an uneven split: every chunk's blocks (config.h)
};

struct TrainingRun {
  const char* group;
  const char* family;
  std::string label;
  std::string source; // with the software version that ran it
  const char* gpu;    // the preset of each node's GPUs
  Unit unit;
  double published;
  const char* fitted; // the constant fitted on this row; "" held out
  std::function<TrainConfig()> config;
  // Plan every block, not estimate_layout: an uneven pipeline split, or the distributed
  // optimizer's gathers over slow links (docs/cost-model.md, the README rows).
  bool whole = false;
};

constexpr const char* kMegatronLm = "Megatron-LM README (H100)";
constexpr const char* kBridge = "Megatron-Bridge performance summary (DGX-H100)";
constexpr const char* kAutoModel = "NeMo AutoModel performance summary (DGX-H100)";
constexpr const char* kTorchtitan = "torchtitan H100 benchmarks";
constexpr const char* kNemoLong = "NeMo long-sequence performance (DGX-H100)";

// The one dense bf16 row the Hopper GEMM efficiency is fitted on (the README's 16B) and the one
// FP8 row the FP8 efficiency is fitted on, chosen before any H100 row was predicted
// (docs/cost-model.md).
constexpr const char* kFp8Fit = "FP8 GEMM efficiency";
constexpr const char* kHopperFit = "Hopper GEMM efficiency";

// `c` laid out as `l` at `precision` with `recompute`, tensor parallelism with sequence
// parallelism (as Megatron and torchtitan run it), and validated.
TrainConfig lay_out(TrainConfig c, const Layout& l, const char* precision, const char* recompute,
                    bool tp_overlap = true, const char* cp_comm = "ring") {
  c.data = "synthetic";
  c.device = "meta";
  c.gpus = l.gpus;
  c.tp = l.tp;
  c.pp = l.pp;
  c.virtual_stages = l.virtual_stages;
  c.cp = l.cp;
  c.cp_comm = cp_comm; // Megatron's default is ring (--cp-comm-type p2p)
  c.ep = l.ep;
  c.zero = l.zero;
  // Every ZeRO 1 row here is Megatron-Core's (Megatron-LM, NeMo, Megatron-Bridge): its
  // distributed optimizer with --overlap-grad-reduce and --overlap-param-gather.
  c.distributed_optimizer = l.zero == 1;
  c.sequence_parallel = l.tp > 1;
  c.stage_layers = l.stage_layers;
  c.global_batch_size = l.global_batch;
  c.micro_batch_size = l.micro_batch;
  c.precision = precision;
  c.recompute = recompute;
  c.attention = "fused";
  c.optimizer.name = "adam";
  // Megatron overlaps tensor parallelism's communication with its GEMMs (--tp-comm-overlap:
  // the README's runs, Megatron-Bridge's userbuffers, NeMo's); torchtitan's rows without async
  // TP do not (their rows say so).
  c.tp_comm_overlap = tp_overlap;
  c.progress = false;
  validate(c);
  return c;
}

TrainConfig preset(const char* name, int64_t seq) {
  TrainConfig c = preset_config(name);
  c.shape.seq_len = seq;
  return c;
}

// The Megatron-LM README's GPTs: 12h² a block (a 4h GeLU MLP, no grouped queries), vocabulary
// 131,072, sequence 4,096, the head untied (the table's parameter counts say so).
TrainConfig readme_gpt(int64_t heads, int64_t hidden, int64_t layers) {
  TrainConfig c;
  c.model = "gpt";
  c.shape.heads = heads;
  c.shape.hidden = hidden;
  c.shape.layers = layers;
  c.shape.vocab = 131072;
  c.shape.seq_len = 4096;
  c.shape.tie_head = false;
  return c;
}

// Llama 2 7B (meta-llama/Llama-2-7b-hf's config.json): 32 blocks of 4096, 32 heads each with
// its own keys and values, SwiGLU of 11,008, vocabulary 32,000.
TrainConfig llama2_7b(int64_t seq) {
  TrainConfig c;
  c.model = "llama";
  c.shape.layers = 32;
  c.shape.hidden = 4096;
  c.shape.heads = 32;
  c.shape.kv_heads = 32;
  c.shape.ffn_hidden = 11008;
  c.shape.vocab = 32000;
  c.shape.seq_len = seq;
  return c;
}

double megatron_flops_of(const TrainConfig& c) {
  const TransformerShape& s = c.shape;
  const bool gated = c.model == "llama";
  const double ffn =
      s.ffn_hidden > 0 ? static_cast<double>(s.ffn_hidden) : 4.0 * static_cast<double>(s.hidden);
  const double kv = s.kv_heads > 0 ? static_cast<double>(s.kv_heads) : static_cast<double>(s.heads);
  return megatron_flops(static_cast<double>(c.global_batch_size), static_cast<double>(s.seq_len),
                        static_cast<double>(s.layers), static_cast<double>(s.hidden),
                        static_cast<double>(s.heads), kv, ffn, gated, static_cast<double>(s.vocab));
}

double predict_run(const TrainingRun& run, const Efficiency& efficiency) {
  const TrainConfig c = run.config();
  const int per_node = std::min(c.gpus, 8);
  const ClusterSpec cluster =
      parse_cluster_spec(fmt::format("{}x{}x{}", c.gpus / per_node, per_node, run.gpu));
  PredictOptions target;
  target.efficiency = efficiency;
  const PlanFigures f = run.whole ? plan_on(c, cluster, nullptr, nullptr, target)
                                  : estimate_layout(c, cluster, kPlanCapacity, target);
  if (run.unit == Unit::TokensPerGpu)
    return f.tokens_per_s_per_gpu;
  return megatron_flops_of(c) / c.gpus / f.step_seconds / 1e12;
}

std::string layout_text(const Layout& l) {
  std::string t = fmt::format("tp {} pp {}", l.tp, l.pp);
  if (l.virtual_stages > 1)
    t += fmt::format(" vp {}", l.virtual_stages);
  if (l.cp > 1)
    t += fmt::format(" cp {}", l.cp);
  if (l.ep > 1)
    t += fmt::format(" ep {}", l.ep);
  return t + fmt::format(" dp {}{}, gbs {} mbs {}", l.gpus / (l.tp * l.pp * l.cp),
                         l.zero >= 3 ? " (FSDP)" : "", l.global_batch, l.micro_batch);
}

// The Megatron-LM README's table (Megatron-Core r0.8.0, commit f2e5db402c): weak scaling at
// dp 48. What it does not say is assumed: bf16 (its MFU is against the bf16 peak), micro-batch
// 1, FlashAttention, sequence parallelism with tp, the distributed optimizer (its
// --overlap-param-gather needs it), no recomputation, no interleaving. Its gradients are
// reduced in bf16 here, though r0.8.0 reduced a bf16 run's in fp32 (--reduce-fp32 plans that):
// the 16B row fitted the Hopper efficiency, and how much of that traffic its step exposes
// turns on its unpublished micro-batch size (docs/cost-model.md, "Where the targets stand").
// Planned whole: each block's parameter gather over the 48 nodes of dp outlasts its forward,
// and the backlog a 1- or 2-block plan's head hides does not carry on linearly
// (estimate_layout was 0.2 to 6.5 points off).
struct ReadmeRow {
  const char* label;
  int64_t heads, hidden, layers;
  int tp, pp;
  int64_t batch;
  double tflops;
};
const ReadmeRow kReadme[] = {
    {"1.7B", 16, 2048, 24, 1, 1, 192, 408.8},    {"7.1B", 32, 4096, 30, 2, 1, 192, 465.9},
    {"16B", 48, 6144, 32, 4, 1, 192, 489.1},     {"32B", 56, 7168, 48, 8, 1, 192, 459.6},
    {"70B", 64, 8192, 84, 8, 2, 384, 419.7},     {"119B", 80, 10240, 92, 8, 4, 768, 420.5},
    {"177B", 96, 12288, 96, 8, 6, 1152, 432.8},  {"314B", 128, 16384, 96, 8, 8, 1536, 474.4},
    {"462B", 144, 18432, 112, 8, 16, 3072, 459.9},
};

void add_readme_rows(std::vector<TrainingRun>& runs) {
  for (const ReadmeRow& r : kReadme) {
    Layout l;
    l.gpus = 48 * r.tp * r.pp;
    l.tp = r.tp;
    l.pp = r.pp;
    l.global_batch = r.batch;
    runs.push_back({kMegatronLm, kFamilyDense,
                    fmt::format("GPT {} on {} H100: {}", r.label, l.gpus, layout_text(l)),
                    "NVIDIA/Megatron-LM README (Megatron-Core r0.8.0)", "h100",
                    Unit::MegatronTflops, r.tflops,
                    std::string(r.label) == "16B" ? kHopperFit : "", [r, l] {
                      return lay_out(readme_gpt(r.heads, r.hidden, r.layers), l, "bf16", "none");
                    },
                    /*whole=*/true});
  }
}

Layout layout(int gpus, int tp, int pp, int vp, int cp, int ep, int zero, int64_t gbs,
              int64_t mbs) {
  Layout l;
  l.gpus = gpus;
  l.tp = tp;
  l.pp = pp;
  l.virtual_stages = vp;
  l.cp = cp;
  l.ep = ep;
  l.zero = zero;
  l.global_batch = gbs;
  l.micro_batch = mbs;
  return l;
}

// A row in tokens/s per GPU of `shape` (a preset's, at its sequence) laid out as `l`.
TrainingRun preset_run(const char* group, const char* family, const char* model,
                       const TrainConfig& shape, const Layout& l, const char* precision,
                       const char* recompute, std::string source, const char* gpu,
                       double tokens, const char* fitted = "") {
  const std::string label =
      fmt::format("{} {} on {} {}: seq {}, {}, recompute {}", model, precision, l.gpus, gpu,
                  shape.shape.seq_len, layout_text(l), recompute);
  // torchtitan's context parallelism all-gathers K and V (its context_parallel_rotate_method
  // defaults to allgather), and its FSDP reduce-scatters the gradients in fp32
  // (--training.mixed_precision_reduce, whose one choice is float32).
  const bool torchtitan = std::string(group) == kTorchtitan;
  return {group, family, label, std::move(source), gpu, Unit::TokensPerGpu, tokens, fitted, [=] {
            TrainConfig c = shape;
            c.reduce_fp32 = torchtitan;
            return lay_out(c, l, precision, recompute, !torchtitan,
                           torchtitan ? "allgather" : "ring");
          }};
}

void add_bridge_rows(std::vector<TrainingRun>& runs) {
  // Llama 3 70B: tp 4, pp 8, vp 5, sequence 8192, FP8 current scaling, no recomputation.
  runs.push_back(preset_run(kBridge, kFamilyFp8, "Llama 3 70B", preset("llama3.1-70b", 8192),
                            layout(64, 4, 8, 5, 1, 1, 1, 256, 1), "fp8", "none",
                            "Megatron-Bridge docs/performance-summary (container 26.04.01)",
                            "h100", 1664, kFp8Fit));
  runs.push_back(preset_run(kBridge, kFamilyFp8, "Llama 3 70B", preset("llama3.1-70b", 8192),
                            layout(64, 4, 8, 5, 1, 1, 1, 128, 1), "fp8", "none",
                            "Megatron-Bridge docs/performance-summary (container 25.11, FP8-CS)",
                            "h100", 1602));
  // Llama 3.1 405B: tp 8, pp 8, cp 2, vp 8. Its 126 blocks are planned as 128: Megatron-Bridge
  // counts the embedding and the loss as a block each in its split, so each of the 64 chunks
  // does two blocks' work, as an even split of 128 does.
  TrainConfig llama405b = preset("llama3.1-405b", 8192);
  llama405b.shape.layers = 128;
  for (const auto& [gbs, tokens, container] :
       {std::tuple<int64_t, double, const char*>{1536, 328, "26.04.01"},
        {512, 292, "25.11, FP8-CS"}}) {
    TrainingRun run = preset_run(
        kBridge, kFamilyFp8, "Llama 3.1 405B", llama405b, layout(1024, 8, 8, 8, 2, 1, 1, gbs, 1),
        "fp8", "none",
        fmt::format("Megatron-Bridge docs/performance-summary (container {})", container), "h100",
        tokens);
    run.label += ", 126 blocks planned as 128";
    runs.push_back(run);
  }
  // Qwen3-30B-A3B: ep 16 over 16 GPUs, FP8, no recomputation, routing forced balanced.
  runs.push_back(preset_run(kBridge, kFamilyMoe, "Qwen3-30B-A3B", preset("qwen3-30b-a3b", 4096),
                            layout(16, 1, 1, 1, 1, 16, 1, 1024, 1), "fp8", "none",
                            "Megatron-Bridge docs/performance-summary (container 26.04.01)",
                            "h100", 8960));
}

void add_automodel_rows(std::vector<TrainingRun>& runs) {
  const std::string source = "NVIDIA-NeMo/Automodel docs/performance-summary (main, 2025-10)";
  // BF16, FSDP2 (ZeRO 3), activation checkpointing (full recomputation).
  runs.push_back(preset_run(kAutoModel, kFamilyDense, "Llama 3 70B", preset("llama3.1-70b", 8192),
                            layout(64, 1, 1, 1, 2, 1, 3, 128, 1), "bf16", "full", source, "h100",
                            866.77));
  // The MoE rows' configs (examples/benchmark/configs: qwen3_moe_30b_te_deepep.yaml,
  // deepseek_v3_te_deepep.yaml and its _1024) run the loss as MaskedCrossEntropy with
  // fp32_upcast: false, the cross-entropy in bf16 (--no-loss-upcast); DeepSeek-V3's also set
  // the parallelizer's reshard_after_forward: false (--no-reshard-after-forward), Qwen3's
  // leaves it to the default.
  const auto as_configured = [](TrainConfig c, bool reshard_after_forward) {
    c.loss_upcast = false;
    c.reshard_after_forward = reshard_after_forward;
    return c;
  };
  // Planned whole: estimated from 1 and 2 blocks and micro-batches (ZeRO 3, full recompute,
  // micro-batches of 4) its step came out 3 % longer than the whole plan's.
  TrainingRun qwen3 = preset_run(kAutoModel, kFamilyMoe, "Qwen3-30B-A3B",
                                 as_configured(preset("qwen3-30b-a3b", 4096), true),
                                 layout(8, 1, 1, 1, 1, 8, 3, 512, 4), "bf16", "full", source,
                                 "h100", 12040);
  qwen3.whole = true;
  runs.push_back(qwen3);
  // DeepSeek-V3: pp 4 with 8 chunks a stage (interleaved 1F1B, layers_per_stage 2) over its 61
  // blocks in 32 chunks: 1, then 29 of 2, then 1 and 1; ep 64, FSDP over dp. An uneven split is
  // planned whole, not estimated.
  std::string chunks = "1";
  for (int i = 0; i < 29; ++i)
    chunks += ",2";
  chunks += ",1,1";
  for (const auto& [gpus, gbs, tokens] :
       {std::tuple<int, int64_t, double>{256, 512, 1002}, {1024, 8192, 865}}) {
    Layout l = layout(gpus, 1, 4, 8, 1, 64, 3, gbs, 1);
    l.stage_layers = chunks;
    TrainingRun run = preset_run(kAutoModel, kFamilyMoe, "DeepSeek-V3",
                                 as_configured(preset("deepseek-v3", 4096), false), l, "bf16",
                                 "full", source, "h100", tokens);
    run.label += " (chunks of 1, 2 × 29, 1, 1 blocks)";
    run.whole = true;
    runs.push_back(run);
  }
}

void add_torchtitan_rows(std::vector<TrainingRun>& runs) {
  // torch 1963fc8, torchao eab345c, torchtitan 9dec370 (2024-12) on Grand Teton H100s: 96 GB
  // HBM2e, 2.4 TB/s, a 500 W power limit (h100-96). Sequence 8,192 (the configs' default).
  // The 8B runs' "selective" is the 8B config's `selective_ac_option = "op"`: op-level
  // checkpointing (--recompute op).
  const std::string source = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md";
  const auto fsdp = [](int gpus, int64_t local) {
    return layout(gpus, 1, 1, 1, 1, 1, 3, local * gpus, local);
  };
  // Tables 1 and 3 time the same runs eager and compiled: the eager rows count RMSNorm and the
  // rotation op by op (--elementwise eager), the compiled ones one kernel a step (fused).
  for (const auto& [gpus, eager, compiled, fp8] :
       {std::tuple<int, double, double, double>{8, 5762, 6667, 8532}, {128, 5605, 6514, 8380}}) {
    for (const auto& [mode, tokens] : {std::pair<std::string, double>{"eager", eager},
                                        {"torch.compile", compiled}}) {
      TrainConfig model = preset("llama3.1-8b", 8192);
      model.elementwise = mode == "eager" ? "eager" : "fused";
      TrainingRun run = preset_run(kTorchtitan, kFamilyDense, "Llama 3 8B", model, fsdp(gpus, 2),
                                   "bf16", "op", source + " (" + mode + ")", "h100-96", tokens);
      run.label += ", " + mode;
      runs.push_back(run);
    }
    runs.push_back(preset_run(kTorchtitan, kFamilyFp8, "Llama 3 8B", preset("llama3.1-8b", 8192),
                              fsdp(gpus, 2), "fp8", "op",
                              source + " (torch.compile, float8 tensorwise)", "h100-96", fp8));
  }
  runs.push_back(preset_run(kTorchtitan, kFamilyFp8, "Llama 3 70B", preset("llama3.1-70b", 8192),
                            layout(256, 8, 1, 1, 1, 1, 3, 512, 16), "fp8", "full",
                            source + " (torch.compile, float8 tensorwise, no async TP)", "h100-96",
                            829));
  // Context parallelism: 8B on 8 GPUs, local batch 1, FP8, compile, full recomputation.
  for (const auto& [cp, tokens] : {std::pair<int, double>{1, 3890}, {2, 2540}, {4, 1071}, {8, 548}})
    runs.push_back(preset_run(kTorchtitan, kFamilyLongContext, "Llama 3 8B",
                              preset("llama3.1-8b", 32768 * cp),
                              layout(8, 1, 1, 1, cp, 1, 3, 8 / cp, 1), "fp8", "full",
                              source + " (torch.compile, float8)", "h100-96", tokens));
}

// NeMo 24.03.01's long-sequence table: Llama 2 7B, FP8, 4M tokens a step; with cp where the
// table has it. Assumed: micro-batch 1, the distributed optimizer, no recomputation, Megatron's
// FLOPs count.
void add_nemo_long_rows(std::vector<TrainingRun>& runs) {
  struct Row {
    int64_t seq_k;
    int gpus, tp, pp, cp;
    double tflops;
  };
  const Row rows[] = {
      {4, 4, 1, 1, 1, 768},     {8, 8, 1, 2, 1, 730},      {16, 16, 2, 1, 1, 660},
      {32, 32, 2, 1, 2, 610},   {64, 64, 4, 1, 2, 574},    {128, 128, 4, 1, 4, 555},
      {256, 256, 4, 1, 8, 549}, {512, 512, 8, 1, 16, 549}, {1024, 1024, 8, 1, 32, 536}};
  for (const Row& r : rows) {
    const int64_t seq = r.seq_k * 1024;
    const Layout l = layout(r.gpus, r.tp, r.pp, 1, r.cp, 1, 1, 4 * 1024 * 1024 / seq, 1);
    runs.push_back(
        {kNemoLong, kFamilyLongContext,
         fmt::format("Llama 2 7B fp8 on {} H100: seq {}K, {}", r.gpus, r.seq_k, layout_text(l)),
         "NVIDIA/NeMo docs performance_long_sequence.md (NeMo 24.03.01)", "h100",
         Unit::MegatronTflops, r.tflops, "",
         [l, seq] { return lay_out(llama2_7b(seq), l, "fp8", "none"); }});
  }
}

} // namespace

double megatron_flops(double batch, double seq, double layers, double hidden, double heads,
                      double kv_heads, double ffn, bool gated, double vocab) {
  return 12 * batch * seq * layers * hidden * hidden *
         ((1 + kv_heads / heads + seq / hidden) + ffn / hidden * (gated ? 1.5 : 1) +
          vocab / (2 * layers * hidden));
}

std::vector<PublishedRow> h100_training_rows(const Efficiency& efficiency) {
  std::vector<TrainingRun> runs;
  add_readme_rows(runs);
  add_bridge_rows(runs);
  add_automodel_rows(runs);
  add_torchtitan_rows(runs);
  add_nemo_long_rows(runs);
  std::vector<PublishedRow> rows;
  for (const TrainingRun& run : runs)
    rows.push_back({run.group, run.family, run.label, run.source, unit_name(run.unit),
                    run.published, run.published, run.fitted,
                    [run, efficiency] { return predict_run(run, efficiency); }});
  return rows;
}

} // namespace meshsim
