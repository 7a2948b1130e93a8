// `meshsim plan`: train's flags plus --cluster, and no data. The configuration's strategy runs
// on the meta device (train/plan.h), each GPU's bytes are counted as in a real run, and the
// cost model replays the step on the cluster.
#include <fmt/format.h>

#include "cli/commands.h"
#include "cost/predict.h"
#include "memory/category.h"
#include "models/models.h"
#include "models/presets.h"
#include "report/atomic_file.h"
#include "report/trace.h"
#include "train/plan.h"

namespace meshsim {
namespace {

int64_t parameter_count(const TrainConfig& c) { return preset_parameter_count(c.model, c.gpt); }

int64_t max_peak(const Plan& plan) {
  int64_t peak = 0;
  for (const auto& r : plan.ranks)
    peak = std::max(peak, r.stats.peak);
  return peak;
}

// Far above any GPU: a plan reports whether it fits instead of stopping at the first byte over.
constexpr int64_t kPlanCapacity = int64_t{1} << 60;

nlohmann::json by_category(const std::array<int64_t, kNumCategories>& bytes) {
  nlohmann::json out = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c)
    out[category_name(static_cast<MemoryCategory>(c))] = bytes[static_cast<size_t>(c)];
  return out;
}

// One entry per pipeline stage, or per (stage, tp rank) where a stage's tp ranks differ.
nlohmann::json stages_json(const Plan& plan) {
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < plan.dims.pp; ++s) {
    std::vector<const PlannedRank*> members;
    for (const auto& r : plan.ranks)
      if (r.coord.pp == s)
        members.push_back(&r);
    const bool alike = std::all_of(members.begin(), members.end(), [&](const PlannedRank* r) {
      return r->stats.peak_by_category == members.front()->stats.peak_by_category &&
             r->model_state_bytes == members.front()->model_state_bytes;
    });
    for (const PlannedRank* r : members) {
      nlohmann::json e{{"stage", s},
                       {"peak_bytes", r->stats.peak},
                       {"model_state_bytes", r->model_state_bytes},
                       {"peak_by_category", by_category(r->stats.peak_by_category)}};
      if (!alike)
        e["tp_rank"] = r->coord.tp;
      stages.push_back(e);
      if (alike)
        break;
    }
  }
  return stages;
}

// The table: `doc` (what --json prints) for a person.
void print_plan(const nlohmann::json& doc, const TrainConfig& c, const Plan& plan) {
  auto bytes = [](const nlohmann::json& v) { return format_bytes(v.get<int64_t>()); };
  fmt::print("meshsim plan: {} ({} parameters) on {}: {}{}, zero {}, {}, global batch {} ({} "
             "micro-batch{} of {} per replica), recompute {}\n",
             c.preset.empty() ? c.model : c.preset, short_count(doc["parameters"].get<int64_t>()),
             doc["cluster"].get<std::string>(), plan.dims.describe(),
             c.sequence_parallel ? " with sequence parallel" : "", c.zero, c.precision,
             plan.samples_per_step, c.micro_batches, c.micro_batches == 1 ? "" : "es",
             doc["layout"]["micro_batch_size"].get<int64_t>(), c.recompute);
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
  fmt::print("predicted step {:.3f} s, {:.0f} tokens/s per GPU, {:.1f} TFLOP/s per GPU, MFU {:.1f}%\n",
             doc["step_seconds"].get<double>(), doc["tokens_per_s_per_gpu"].get<double>(),
             doc["tflops_per_gpu"].get<double>(), 100 * doc["mfu"].get<double>());
  fmt::print("fits: {} (peak {} of {} per GPU)\n", doc["fits"].get<bool>() ? "yes" : "no",
             format_bytes(peak), bytes(doc["gpu_memory_bytes"]));
}

} // namespace

void add_plan_flags(CLI::App& app, TrainConfig& config, PlanArgs& args) {
  add_train_flags(app, config);
  app.add_flag("--json", args.json, "print one JSON object instead of the table");
}

int run_plan(TrainConfig config, const PlanArgs& args) {
  try {
    if (config.cluster.empty())
      throw std::invalid_argument("meshsim plan needs --cluster (the GPUs to plan for, e.g. 8xh100)");
    const ClusterSpec cluster = parse_cluster_spec(config.cluster, config.intra, config.inter);
    if (!cluster.note.empty())
      fmt::print(stderr, "meshsim: {}\n", cluster.note);
    if (!args.gpus_given)
      config.gpus = cluster.world_size();
    if (config.gpus != cluster.world_size())
      throw std::invalid_argument(fmt::format("--gpus {} differs from --cluster {}'s {} GPUs",
                                              config.gpus, config.cluster, cluster.world_size()));
    if (config.gpus > kMaxGpus)
      throw std::invalid_argument(
          fmt::format("--cluster {} has {} GPUs; a plan covers at most {}", config.cluster,
                      config.gpus, kMaxGpus));
    config.data = "synthetic"; // a plan reads no data
    validate(config);
    check_plannable(config);
    const RunClock clock;
    fmt::print(stderr, "meshsim: planning {} step(s) of {} on the meta device...\n", kPlanSteps,
               config.model);
    const Plan plan = make_plan(config, kPlanCapacity);
    fmt::print(stderr, "meshsim: ran {} of {} GPUs (one per symmetry class) in {:.1f} s; replaying "
                       "the step on {}...\n",
               plan.ranks.size(), plan.dims.world, clock.now(), cluster.to_string());
    const double replay_start = clock.now();
    PredictOptions options;
    options.dtype = parse_dtype(config.precision); // the math of the planned run
    options.images = true; // the GPUs not executed are images of those that were
    const Prediction p = predict(plan.recorders, plan.samples_per_step, cluster, options);
    fmt::print(stderr, "meshsim: replayed in {:.1f} s\n", clock.now() - replay_start);
    const bool fits = max_peak(plan) <= static_cast<int64_t>(cluster.gpu.mem_bytes);
    nlohmann::json doc{{"model", config.model},
                       {"preset", config.preset},
                       {"precision", config.precision},
                       {"parameters", parameter_count(config)},
                       {"cluster", cluster.to_string()},
                       {"layout", {{"dp", plan.dims.dp}, {"tp", plan.dims.tp}, {"pp", plan.dims.pp},
                                   {"zero", config.zero},
                                   {"sequence_parallel", config.sequence_parallel},
                                   {"micro_batches", config.micro_batches},
                                   {"micro_batch_size", plan.samples_per_step /
                                                            (plan.dims.dp * config.micro_batches)},
                                   {"recompute", config.recompute}}},
                       {"global_batch_size", plan.samples_per_step},
                       {"step_seconds", p.step_time_s},
                       {"tokens_per_s_per_gpu",
                        p.samples_per_s * static_cast<double>(config.gpt.seq_len) / plan.dims.world},
                       {"tflops_per_gpu", p.tflops_per_gpu},
                       {"mfu", p.mfu},
                       {"gpu_memory_bytes", static_cast<int64_t>(cluster.gpu.mem_bytes)},
                       {"fits", fits},
                       {"stages", stages_json(plan)}};
    if (!config.out.empty()) {
      const std::filesystem::path dir(config.out);
      std::filesystem::create_directories(dir);
      write_file_atomic(dir / "plan.json", doc.dump(2) + "\n");
      write_chrome_trace(dir / "trace.json",
                         chrome_trace(p.timeline, {}, fmt::format("predicted {}", p.cluster)));
    }
    if (args.json)
      fmt::print("{}\n", doc.dump(2));
    else
      print_plan(doc, config, plan);
    return kExitOk;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "meshsim: {}\n", one_line(e));
    return kExitUsage;
  } catch (const OutOfMemory& e) {
    fmt::print(stderr, "meshsim: {}\n", one_line(e));
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: {}\n", one_line(e));
    return kExitFailure;
  }
}

} // namespace meshsim
