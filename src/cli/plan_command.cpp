// `meshsim plan`: train's flags plus --cluster, and no data. The configuration's strategy runs
// on the meta device (plan/plan.h), each GPU's bytes are counted as in a real run, and the
// cost model replays the step on the cluster.
#include <algorithm>

#include <fmt/format.h>

#include "cli/commands.h"
#include "plan/moe_routing.h"
#include "cli/integer_flag.h"
#include "config/stage_layers.h"
#include "cost/predict.h"
#include "memory/category.h"
#include "models/family.h"
#include "models/models.h"
#include "models/presets.h"
#include "base/atomic_file.h"
#include "report/memory_report.h"
#include "report/plan_page.h"
#include "report/trace.h"
#include "plan/plan.h"
#include "plan/step_timeline.h"

namespace meshsim {
namespace {

int64_t parameter_count(const TrainConfig& c) {
  // Closed form where the family has one: a real-size preset is never built.
  const ModelFamily& family = model_family(c.model);
  if (family.parameter_count)
    return family.parameter_count(c.shape);
  ModelOptions shapes;
  shapes.device = torch::kMeta;
  return count_parameters(*build_model(c.model, shapes));
}

nlohmann::json by_category(const CategoryBytes& bytes) {
  nlohmann::json out = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    out[category_name(static_cast<MemoryCategory>(c))] = bytes[static_cast<size_t>(c)];
  return out;
}

// One entry per pipeline stage, or per (stage, tp rank) where a stage's tp ranks differ.
nlohmann::json stages_json(const PlanFigures& f) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageFigures& s : f.stages) {
    nlohmann::json e{{"stage", s.stage},
                     {"peak_bytes", s.peak_bytes},
                     {"model_state_bytes", s.model_state_bytes},
                     {"peak_by_category", by_category(s.peak_by_category)}};
    if (s.tp_rank >= 0)
      e["tp_rank"] = s.tp_rank;
    stages.push_back(e);
  }
  return stages;
}

// memory.png: each executed GPU (one per stage) over the planned step, against the target
// GPU's memory. A picture that cannot be drawn (no gnuplot) is reported, never fatal.
void write_plan_picture(const std::filesystem::path& png, const Plan& plan, const PlanFigures& f,
                        const TrainConfig& config) {
  std::vector<std::string> labels;
  for (const PlannedRank& r : plan.ranks)
    labels.push_back(fmt::format("stage {} (gpu {})", r.coord.pp, r.rank));
  const std::vector<int64_t> capacities(plan.ranks.size(), f.gpu_memory_bytes);
  std::string error;
  if (!plot_memory(png, plan.timeline, capacities,
                   fmt::format("meshsim plan: {}, {} (planned step)",
                               config.preset.empty() ? config.model : config.preset,
                               plan.dims.describe()),
                   &error, labels))
    fmt::print(stderr, "meshsim: no memory.png: {}\n", error);
}

// The table: `doc` (what --json prints) for a person.
void print_plan(const nlohmann::json& doc, const TrainConfig& c) {
  auto bytes = [](const nlohmann::json& v) { return format_bytes(v.get<int64_t>()); };
  fmt::print("meshsim plan: {} ({} parameters) on {}: {}{}, zero {}{}, {}, global batch {} ({} "
             "micro-batch{} of {} per replica), recompute {}{}\n",
             c.preset.empty() ? c.model : c.preset, short_count(doc["parameters"].get<int64_t>()),
             doc["cluster"].get<std::string>(),
             layout_dims(c).describe(),
             std::string(c.sequence_parallel ? " with sequence parallel" : "") +
                 (c.pp_scatter_gather ? ", pipeline messages scattered over tp" : "") +
                 (c.tp_comm_overlap ? ", tp communication overlapped" : "") +
                 (c.cp > 1 ? " (cp by " + c.cp_comm + ")" : "") +
                 (c.ep > 1 && c.moe_dispatch != "deepep" ? " (ep by " + c.moe_dispatch + ")" : ""),
             c.zero,
             std::string(c.distributed_optimizer ? " (distributed optimizer)" : "") +
                 (c.reshard_after_forward ? "" : " (no reshard after forward)") +
                 (c.reduce_fp32 ? " (reduced in fp32)" : ""),
             c.precision + (c.loss_upcast || c.precision == "fp32"
                                ? ""
                                : fmt::format(" (the loss in {}, no fp32 upcast)",
                                              c.precision == "fp16" ? "fp16" : "bf16")),
             doc["global_batch_size"].get<int64_t>(), c.micro_batches, c.micro_batches == 1 ? "" : "es",
             doc["layout"]["micro_batch_size"].get<int64_t>(), c.recompute,
             model_family(c.model).transformer
                 ? ", attention " + c.attention +
                       (c.elementwise == "eager" ? ", elementwise eager" : "")
                 : "");
  fmt::print("{:<6} {:<4} {:>11} {:>12} {:>11} {:>11} {:>11} {:>12} {:>14} {:>10}\n", "stage",
             "tp", "peak", "model state", "parameters", "gradients", "optimizer", "activations",
             "communication", "other");
  int64_t peak = 0;
  for (const auto& e : doc["stages"]) {
    const auto& cat = e["peak_by_category"];
    peak = std::max(peak, e["peak_bytes"].get<int64_t>());
    fmt::print("{:<6} {:<4} {:>11} {:>12} {:>11} {:>11} {:>11} {:>12} {:>14} {:>10}\n",
               e["stage"].get<int>(), e.contains("tp_rank") ? fmt::format("{}", e["tp_rank"].get<int>()) : "all",
               bytes(e["peak_bytes"]), bytes(e["model_state_bytes"]), bytes(cat["parameters"]),
               bytes(cat["gradients"]), bytes(cat["optimizer"]), bytes(cat["activations"]),
               bytes(cat["communication"]), bytes(cat["other"]));
  }
  // An image model's "tokens" are its images (one each).
  const ModelFamily* family = find_model_family(doc["model"].get<std::string>());
  const bool images = !(family && family->transformer);
  fmt::print("predicted step {:.3f} s, {:.0f} {}/s per GPU, {:.1f} TFLOP/s per GPU, MFU {:.1f}%\n",
             doc["step_seconds"].get<double>(), doc["tokens_per_s_per_gpu"].get<double>(),
             images ? "images" : "tokens",
             doc["tflops_per_gpu"].get<double>(), 100 * doc["mfu"].get<double>());
  fmt::print("fits: {} (peak {} of {} per GPU)\n", doc["fits"].get<bool>() ? "yes" : "no",
             format_bytes(peak), bytes(doc["gpu_memory_bytes"]));
}

// The predicted step per stage: compute, exposed communication, bubble (plan/step_timeline.h).
nlohmann::json timeline_json(const Plan& plan, const Prediction& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageTimeline& t : stage_timelines(plan, p)) {
    nlohmann::json segments = nlohmann::json::array();
    for (const StepSegment& s : t.segments)
      segments.push_back({s.start_s, s.end_s, activity_name(s.activity)});
    stages.push_back({{"stage", t.stage},
                      {"rank", t.rank},
                      {"compute_s", t.compute_s},
                      {"exposed_comm_s", t.exposed_comm_s},
                      {"bubble_s", t.bubble_s},
                      {"segments", segments}});
  }
  return {{"step_seconds", p.replay.makespan_s},
          {"overlap_penalty_seconds", p.overlap_penalty_s},
          {"stages", stages}};
}

nlohmann::json link_json(const LinkSpec& link) {
  return {{"name", link.name}, {"gb_per_s", link.bandwidth / 1e9}, {"efficiency", link.efficiency}};
}

// What the prediction took as given: the numbers a person would question first.
nlohmann::json assumptions_json(const TrainConfig& c, const ClusterSpec& cluster) {
  // What plan_on predicts with: on Hopper, Hopper's GEMM efficiency.
  const Efficiency eff = PredictOptions{}.efficiency.on(cluster.gpu);
  const bool fp8 = c.precision == "fp8";
  nlohmann::json efficiencies{{"matmul", eff.matmul},
                              {"attention", eff.attention},
                              {"normalization", eff.normalization},
                              {"elementwise", eff.elementwise},
                              {"optimizer", eff.optimizer},
                              {"memory", eff.memory},
                              {"launch_us", eff.launch_s * 1e6},
                              {"overlap_slowdown", eff.overlap_slowdown}};
  if (fp8)
    efficiencies["fp8_matmul"] = eff.fp8_matmul;
  nlohmann::json gpu{{"name", cluster.gpu.name},
                     {"memory_bytes", static_cast<int64_t>(cluster.gpu.mem_bytes)},
                     {"bf16_tflops", cluster.gpu.bf16_flops / 1e12},
                     {"hbm_tb_per_s", cluster.gpu.mem_bw / 1e12}};
  if (fp8)
    gpu["fp8_tflops"] = cluster.gpu.fp8_flops / 1e12;
  const bool transformer = model_family(c.model).transformer;
  return {{"precision", fp8 ? "fp8 (the blocks' linear GEMMs; the rest bf16)" : c.precision},
          {"attention", !transformer         ? "none"
                        : c.attention == "fused" ? "fused (no [s, s] scores kept)"
                                                 : "eager ([s, s] scores kept)"},
          {"routing", c.shape.moe.experts > 0 ? c.shape.moe.planned_routing : "no experts"},
          {"elementwise", !transformer              ? "none"
                          : c.elementwise == "eager" ? "eager (RMSNorm and the rotation op by op)"
                                                     : "fused (one kernel a step)"},
          {"recompute", c.recompute},
          {"tp_comm_overlap", c.tp_comm_overlap},
          {"gpu", gpu},
          {"links",
           {{"intra", link_json(cluster.intra)},
            {"inter", link_json(cluster.inter)},
            {"nics_per_node", cluster.nics()}}},
          {"efficiencies", efficiencies}};
}

} // namespace

nlohmann::json layout_json(const TrainConfig& c) {
  return {{"dp", c.gpus / (c.tp * c.pp * c.cp)},
          {"cp", c.cp},
          {"cp_comm", c.cp_comm},
          {"ep", c.ep},
          {"moe_dispatch", c.moe_dispatch},
          {"loss_upcast", c.loss_upcast},
          {"tp", c.tp},
          {"pp", c.pp},
          {"virtual_stages", c.virtual_stages},
          {"stage_layers", stage_layer_counts(c)},  // blocks per stage (chunk); []: even
          {"zero", c.zero},
          {"dp_shard", c.dp_shard > 0 ? c.dp_shard : c.gpus / (c.tp * c.pp * c.cp)},
          {"reshard_after_forward", c.reshard_after_forward},
          {"reduce_fp32", c.reduce_fp32},
          {"distributed_optimizer", c.distributed_optimizer},
          {"sequence_parallel", c.sequence_parallel},
          {"pp_scatter_gather", c.pp_scatter_gather},
          {"micro_batches", c.micro_batches},
          {"micro_batch_size", micro_batch_size_of(c)},
          {"recompute", c.recompute},
          {"attention", c.attention}};
}

void add_plan_flags(CLI::App& app, TrainConfig& config, PlanArgs& args) {
  add_train_flags(app, config);
  app.add_flag("--json", args.json, "print one JSON object instead of the table");
  app.add_flag("--search", args.search,
               "try every layout (tp within a node, pp, dp, zero, micro-batch size, recompute, "
               "sequence parallel) and print the fastest that fit");
  add_integer_flag(app, "--top", args.top, "layouts --search prints (default 10)", /*min=*/1)
      ->check(CLI::Range(1, 1000));
  app.add_option("--moe-routing", args.moe_routing,
                 "a mixture of experts' routing: balanced, or RUN_DIR (a run's routing.csv: its "
                 "busiest step, rescaled to the plan's experts)")
      ->capture_default_str();
  app.add_option("--moe-imbalance", args.moe_imbalance,
                 "a mixture of experts' routing: expert 0 of every layer takes F times the mean");
}

int run_plan(TrainConfig config, const PlanArgs& args) {
  try {
    if (config.cluster.empty())
      throw std::invalid_argument("meshsim plan needs --cluster (the GPUs to plan for, e.g. 8xh100)");
    const ClusterSpec cluster = parse_cluster_spec(config.cluster, config.intra, config.inter);
    if (!cluster.note.empty())
      fmt::print(stderr, "meshsim: {}\n", cluster.note);
    check_precision_on(config.precision, cluster.gpu); // fp8 without FP8 tensor cores
    if (!args.gpus_given)
      config.gpus = cluster.world_size();
    if (config.gpus != cluster.world_size())
      throw std::invalid_argument(fmt::format("--gpus {} differs from --cluster {}'s {} GPUs",
                                              config.gpus, config.cluster, cluster.world_size()));
    if (config.gpus > kMaxPlannedGpus)
      throw std::invalid_argument(
          fmt::format("--cluster {} has {} GPUs; a plan covers at most {}", config.cluster,
                      config.gpus, kMaxPlannedGpus));
    check_out_folder(config.out, /*may_hold_files=*/false);
    config.data = "synthetic"; // a plan reads no data
    config.device = "meta";    // and computes nothing: fp16 plans too, which CPUs cannot train
    check_plannable(config);
    if (config.shape.moe.experts == 0 && (args.moe_routing != "balanced" || args.moe_imbalance != 0))
      throw std::invalid_argument("--moe-routing and --moe-imbalance plan a mixture of experts: "
                                  "give --moe-experts");
    std::string routing_note; // said once the layout is known to be sound
    if (config.shape.moe.experts > 0) {
      const PlannedRouting routing =
          planned_routing(args.moe_routing, args.moe_imbalance, config.shape.moe.experts);
      config.shape.moe.planned_shares = routing.shares;
      config.shape.moe.planned_routing = routing.description;
      routing_note = fmt::format("meshsim: routing assumed: {}{}\n", routing.description,
                                 config.ep > 1 ? "; every ep rank is planned as the one "
                                                 "holding expert 0"
                                               : "");
    }
    if (args.search && !model_family(config.model).transformer) {
      fmt::print(stderr, "meshsim: plan --search lays out transformers (gpt, llama); plan {} "
                         "one layout at a time\n",
                 config.model);
      return kExitUsage;
    }
    if (args.search) {
      fmt::print(stderr, "{}", routing_note);
      return run_search(config, cluster, args);
    }
    validate(config);
    fmt::print(stderr, "{}", routing_note);
    check_plan_work(config, kPlanSteps);
    const nlohmann::json doc = plan_and_write(config, cluster);
    if (args.json)
      fmt::print("{}\n", doc.dump(2));
    else
      print_plan(doc, config);
    return kExitOk;
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

nlohmann::json plan_and_write(const TrainConfig& config, const ClusterSpec& cluster,
                              const nlohmann::json& search) {
  const RunClock clock;
  fmt::print(stderr, "meshsim: planning {} step(s) of {} on the meta device and replaying it on "
                     "{}...\n",
             kPlanSteps, config.model, cluster.to_string());
  Prediction p;
  Plan plan;
  const PlanFigures f = plan_on(config, cluster, &p, &plan);
  fmt::print(stderr, "meshsim: ran {} of {} GPUs (one per symmetry class) and replayed the step "
                     "in {:.1f} s\n",
             std::count_if(plan.ranks.begin(), plan.ranks.end(),
                           [](const PlannedRank& r) { return r.image_of < 0; }),
             f.world, clock.now());
  nlohmann::json doc{{"model", config.model},
                     {"preset", config.preset},
                     {"precision", config.precision},
                     {"parameters", parameter_count(config)},
                     {"cluster", cluster.to_string()},
                     {"layout", layout_json(config)},
                     {"routing", config.shape.moe.experts > 0
                                     ? nlohmann::json(config.shape.moe.planned_routing)
                                     : nlohmann::json(nullptr)},
                     {"global_batch_size", plan.samples_per_step},
                     {"step_seconds", f.step_seconds},
                     {"tokens_per_s_per_gpu", f.tokens_per_s_per_gpu},
                     {"tflops_per_gpu", f.tflops_per_gpu},
                     {"mfu", f.mfu},
                     {"gpu_memory_bytes", f.gpu_memory_bytes},
                     {"fits", f.fits},
                     {"stages", stages_json(f)},
                     {"timeline", timeline_json(plan, p)},
                     {"assumptions", assumptions_json(config, cluster)}};
  if (!config.out.empty()) {
    const std::filesystem::path dir(config.out);
    std::filesystem::create_directories(dir);
    write_file_atomic(dir / "plan.json", doc.dump(2) + "\n");
    write_chrome_trace(dir / "trace.json",
                       chrome_trace(p.timeline, {}, fmt::format("predicted {}", p.cluster)));
    write_plan_picture(dir / "memory.png", plan, f, config);
    write_plan_page(dir / "plan.html", doc, search);
  }
  return doc;
}

} // namespace meshsim
