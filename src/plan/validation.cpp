// The published rows of `meshsim validate` and how each is predicted. Sources and the
// calibration split: docs/cost-model.md.
#include "plan/validation.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cost/collective_cost.h"
#include "memory/category.h"
#include "models/presets.h"
#include "config/config.h"
#include "plan/plan.h"
#include "plan/search.h"
#include "plan/validation_rows.h"

namespace meshsim {
namespace {

constexpr double kGiB = 1024 * kMiB;

// nccl-tests' bus bandwidth of one all_reduce of `bytes` over every GPU of `spec` (or the
// first `gpus` of its first node), in GB/s.
double all_reduce_busbw(const std::string& spec, const std::string& inter, double bytes,
                        Algorithm algorithm, int gpus = 0) {
  const ClusterSpec cluster = parse_cluster_spec(spec, "", inter);
  const GroupShape shape = gpus > 0 ? GroupShape::within_node(gpus)
                                    : GroupShape::across(cluster.nodes, cluster.gpus_per_node);
  const double t = collective_cost(CollectiveOp::AllReduce, bytes, shape, cluster, algorithm).time_s;
  return bandwidths(CollectiveOp::AllReduce, shape.ranks, bytes, t).busbw / 1e9;
}

PublishedRow nccl_row(std::string name, std::string source, double low, double high,
                      std::string fitted, std::function<double()> predict) {
  return {"nccl-tests", kFamilyCollectives, std::move(name), std::move(source), "GB/s busbw", low,
          high, std::move(fitted), std::move(predict)};
}

std::vector<PublishedRow> nccl_rows() {
  std::vector<PublishedRow> rows;
  rows.push_back(nccl_row("8xA100 SXM, NVSwitch, all_reduce 4 GiB", "nccl-tests #175", 232.54,
                          232.54, "NVLink efficiency", [] {
                            return all_reduce_busbw("8xa100-80", "", 4 * kGiB, Algorithm::Auto);
                          }));
  rows.push_back(nccl_row("8xA100 SXM 80GB, NVSwitch, all_reduce 1 GiB", "nccl-tests #149, #178",
                          200, 235, "", [] {
                            return all_reduce_busbw("8xa100-80", "", 1 * kGiB, Algorithm::Auto);
                          }));
  rows.push_back(nccl_row("3 nodes x 8 A100 SXM 40GB, 4 HDR NICs per node, all_reduce 128 MiB",
                          "nccl-tests #119 (peak)", 96, 96, "", [] {
                            return all_reduce_busbw("3x8xa100-40", "4xhdr", 128 * kMiB,
                                                    Algorithm::Auto);
                          }));
  rows.push_back(nccl_row("8xH100 SXM, NVSwitch, ring all_reduce 4 GiB", "nccl #1455, nccl-tests #212",
                          365, 370, "", [] {
                            return all_reduce_busbw("8xh100", "", 4 * kGiB, Algorithm::Ring);
                          }));
  const double nvls[] = {420, 440, 460, 480};
  for (int gpus = 5; gpus <= 8; ++gpus)
    rows.push_back(nccl_row(fmt::format("{}xH100 SXM, NVSwitch, NVLS all_reduce 4 GiB", gpus),
                            "nccl #1455", nvls[gpus - 5], nvls[gpus - 5],
                            gpus == 8 ? "NVLS efficiency" : "", [gpus] {
                              return all_reduce_busbw("8xh100", "", 4 * kGiB, Algorithm::Nvls,
                                                      gpus);
                            }));
  return rows;
}

// One row of Narayanan et al. SC'21 Table 1 with the configuration of Megatron-LM's
// examples/sc21/run_table_1.sh: micro-batch size, layers per virtual stage (0: none), and
// which data-parallel implementation it ran.
struct MegatronRun {
  const char* preset;
  const char* label;
  int tp, pp, gpus;
  int64_t global_batch, micro_batch;
  int layers_per_virtual_stage;
  bool local_ddp; // DDP=local: Megatron's own, which reduces the gradients after backward
  double tflops;
  const char* fitted;
};

// Fitted on the smallest, a middle and a large model, so the GEMM sizes the fit sees span
// the table; the other seven are held out.
constexpr const char* kGemmFit = "GEMM efficiency";
const MegatronRun kTable1[] = {
    {"gpt-1.7b", "1.7B", 1, 1, 32, 512, 16, 0, false, 137, kGemmFit},
    {"gpt-3.6b", "3.6B", 2, 1, 64, 512, 16, 0, false, 138, ""},
    {"gpt-7.5b", "7.5B", 4, 1, 128, 512, 16, 0, false, 142, ""},
    {"gpt-18.4b", "18.4B", 8, 1, 256, 1024, 8, 0, false, 135, ""},
    {"gpt-39.1b", "39.1B", 8, 2, 512, 1536, 4, 0, true, 138, kGemmFit},
    {"gpt-76.1b", "76.1B", 8, 4, 1024, 1792, 2, 5, true, 140, ""},
    {"gpt-145.6b", "145.6B", 8, 8, 1536, 2304, 2, 5, true, 148, ""},
    {"gpt-310.1b", "310.1B", 8, 16, 1920, 2160, 1, 3, true, 155, kGemmFit},
    {"gpt-530b", "529.6B", 8, 35, 2520, 2520, 1, 1, true, 163, ""},
    {"gpt-1t", "1008B", 8, 64, 3072, 3072, 1, 0, true, 163, ""},
};

TrainConfig megatron_config(const MegatronRun& run) {
  TrainConfig c = preset_config(run.preset);
  c.data = "synthetic";
  // Megatron ties the head to the embedding; meshsim ties them only without a pipeline. The
  // head's matmul runs either way: the FLOPs and the step are the same, the pipeline's last
  // stage holds one more [V, h] weight.
  c.shape.tie_head = run.pp == 1;
  c.gpus = run.gpus;
  c.tp = run.tp;
  c.pp = run.pp;
  c.precision = "fp16";
  c.device = "meta";
  c.recompute = "full"; // --recompute-method uniform: every layer recomputed
  c.attention = "eager"; // Megatron-LM in 2021: softmax fused, the scores in memory
  // Its pipeline sent each tp rank's 1/tp of a message and all-gathered them on arrival (on by
  // default then: --no-scatter-gather-tensors-in-pipeline turned it off; the paper's §4.1).
  c.pp_scatter_gather = pipeline_messages_whole_on_tp(c);
  c.micro_batch_size = run.micro_batch;
  c.global_batch_size = run.global_batch;
  if (run.layers_per_virtual_stage > 0)
    c.virtual_stages =
        static_cast<int>(c.shape.layers / run.pp / run.layers_per_virtual_stage);
  c.progress = false;
  validate(c);
  return c;
}

double megatron_tflops(const MegatronRun& run, const Efficiency& efficiency) {
  const TrainConfig c = megatron_config(run);
  const ClusterSpec cluster = parse_cluster_spec(fmt::format("{}x8xa100-80", run.gpus / 8));
  PredictOptions target;
  target.efficiency = efficiency;
  target.overlap_buckets = !run.local_ddp;
  const PlanFigures f = estimate_layout(c, cluster, kPlanCapacity, target);
  const double flops =
      narayanan_flops(static_cast<double>(run.global_batch), static_cast<double>(c.shape.seq_len),
                      static_cast<double>(c.shape.layers), static_cast<double>(c.shape.hidden),
                      static_cast<double>(c.shape.vocab));
  return flops / run.gpus / f.step_seconds / 1e12;
}

std::vector<PublishedRow> narayanan_rows(const Efficiency& efficiency) {
  std::vector<PublishedRow> rows;
  for (const MegatronRun& run : kTable1) {
    const int64_t dp = run.gpus / (run.tp * run.pp);
    const int64_t micro_batches = run.global_batch / (dp * run.micro_batch);
    std::string name =
        fmt::format("GPT {} on {} A100: tp {} pp {} dp {}, mbs {}, {} micro-batches", run.label,
                    run.gpus, run.tp, run.pp, dp, run.micro_batch, micro_batches);
    if (run.layers_per_virtual_stage > 0)
      name += fmt::format(", interleaved ({} layers per virtual stage)", run.layers_per_virtual_stage);
    rows.push_back({"Narayanan et al. SC'21 Table 1", kFamilyOlder, name,
                    "Narayanan et al. SC'21 Table 1; Megatron-LM examples/sc21/run_table_1.sh",
                    "TFLOP/s per GPU", run.tflops, run.tflops, run.fitted,
                    [&run, efficiency] { return megatron_tflops(run, efficiency); }});
  }
  return rows;
}

// PyTorch's DDP benchmark (benchmarks/distributed/ddp/benchmark.py): torchvision's ResNet-50,
// 32 random 224² images per GPU, fp32, SGD with momentum, DDP's default 25 MB buckets, on
// DGX-1 V100s (NVLink 2; four 100 Gb EDR ports per node). "Alone" is the model without DDP;
// meshsim predicts it as DDP on one GPU, whose all-reduces are over a group of one (free).
struct DdpRun {
  int gpus;
  const char* label;
  double seconds;
};
const DdpRun kDdpBenchmark[] = {{1, "1 V100, no DDP", 0.097},
                                {1, "1 V100, DDP", 0.100},
                                {8, "8 V100 (1 node), DDP", 0.104},
                                {16, "16 V100 (2 nodes, 4 EDR per node), DDP", 0.104}};

double ddp_benchmark_seconds(const DdpRun& run, const Efficiency& efficiency) {
  TrainConfig c;
  c.model = "resnet50";
  c.data = "synthetic";
  c.device = "meta";
  c.gpus = run.gpus;
  c.batch_size = 32;
  c.optimizer.name = "sgd";
  c.optimizer.momentum = 0.9;
  c.bucket_mb = 25;
  c.progress = false;
  validate(c);
  const int nodes = (run.gpus + 7) / 8;
  const ClusterSpec cluster =
      nodes > 1 ? parse_cluster_spec(fmt::format("{}x8xv100-32", nodes), "", "4xedr")
                : parse_cluster_spec(fmt::format("{}xv100-32", run.gpus));
  PredictOptions target;
  target.efficiency = efficiency;
  return plan_on(c, cluster, nullptr, nullptr, target).step_seconds;
}

std::vector<PublishedRow> ddp_rows(const Efficiency& efficiency) {
  std::vector<PublishedRow> rows;
  for (const DdpRun& run : kDdpBenchmark)
    rows.push_back({"PyTorch DDP benchmark", kFamilyOlder,
                    fmt::format("ResNet-50, batch 32 per GPU, {}", run.label),
                    "pytorch/pytorch benchmarks/distributed/ddp/README.md", "s per iteration",
                    run.seconds, run.seconds, "",
                    [&run, efficiency] { return ddp_benchmark_seconds(run, efficiency); }});
  return rows;
}

bool starts_with_any(const std::string& name, const std::vector<std::string>& words) {
  if (words.empty())
    return true;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return std::any_of(words.begin(), words.end(),
                     [&](const std::string& w) { return lower.rfind(w, 0) == 0; });
}

void add_mean(ErrorSummary& e, double error, bool calibration) {
  if (calibration) {
    e.calibration_mean_abs += std::abs(error);
    ++e.calibration;
    return;
  }
  e.held_out_mean_abs += std::abs(error);
  e.held_out_worst = std::max(e.held_out_worst, std::abs(error));
  ++e.held_out;
}

void finish_means(ErrorSummary& e) {
  if (e.held_out > 0)
    e.held_out_mean_abs /= e.held_out;
  if (e.calibration > 0)
    e.calibration_mean_abs /= e.calibration;
}

} // namespace

TrainConfig preset_config(const std::string& name) {
  TrainConfig c;
  c.preset = name;
  ModelFlagsGiven given;
  given.preset = true;
  apply_preset(c, given);
  return c;
}

double narayanan_flops(double batch, double seq, double layers, double hidden, double vocab) {
  return 96 * batch * seq * layers * hidden * hidden *
         (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden));
}

double published_error(double predicted, double low, double high) {
  if (predicted < low)
    return (predicted - low) / low;
  if (predicted > high)
    return (predicted - high) / high;
  return 0;
}

const std::vector<std::string>& validation_families() {
  static const std::vector<std::string> families = {kFamilyDense,       kFamilyFp8,
                                                    kFamilyMoe,         kFamilyLongContext,
                                                    kFamilyOlder,       kFamilyCollectives};
  return families;
}

std::vector<PublishedRow> published_rows(const std::vector<std::string>& groups,
                                         const Efficiency& efficiency,
                                         const std::vector<std::string>& families) {
  // The collectives, then the training runs.
  std::vector<PublishedRow> all = nccl_rows();
  for (auto& row : all_to_all_rows())
    all.push_back(std::move(row));
  for (auto* source : {&narayanan_rows, &ddp_rows, &h100_training_rows})
    for (auto& row : (*source)(efficiency))
      all.push_back(std::move(row));
  std::vector<PublishedRow> rows;
  for (auto& row : all)
    if (starts_with_any(row.group, groups) && starts_with_any(row.family, families))
      rows.push_back(std::move(row));
  return rows;
}

ValidationSummary validate_rows(
    const std::vector<PublishedRow>& rows,
    const std::function<void(size_t, size_t, const PublishedRow&)>& progress) {
  ValidationSummary s;
  ErrorSummary all;
  std::vector<ErrorSummary> families(validation_families().size());
  for (size_t f = 0; f < families.size(); ++f)
    families[f].family = validation_families()[f];
  for (size_t i = 0; i < rows.size(); ++i) {
    if (progress)
      progress(i, rows.size(), rows[i]);
    RowResult r;
    r.row = &rows[i];
    try {
      r.predicted = rows[i].predict();
    } catch (const std::exception& e) {
      r.failure = e.what();
      ++s.failed;
      s.rows.push_back(r);
      continue;
    }
    r.error = published_error(r.predicted, rows[i].low, rows[i].high);
    add_mean(all, r.error, rows[i].calibration());
    for (ErrorSummary& f : families)
      if (f.family == rows[i].family)
        add_mean(f, r.error, rows[i].calibration());
    s.rows.push_back(r);
  }
  finish_means(all);
  s.held_out = all.held_out;
  s.held_out_mean_abs = all.held_out_mean_abs;
  s.held_out_worst = all.held_out_worst;
  s.calibration_mean_abs = all.calibration_mean_abs;
  for (ErrorSummary& f : families) {
    finish_means(f);
    if (f.held_out + f.calibration > 0)
      s.families.push_back(f);
  }
  return s;
}

} // namespace meshsim
