// `meshsim plan --search`: the layouts of a model on a cluster, fastest first (plan/search.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "memory/category.h"
#include "models/presets.h"
#include "base/atomic_file.h"
#include "plan/search.h"
#include "report/plan_page.h"

namespace meshsim {
namespace {

nlohmann::json row_json(const Layout& l, int rank) {
  const PlanFigures& f = l.figures;
  nlohmann::json out = {{"rank", rank},
          {"layout", layout_json(l.config)},
          {"step_seconds", f.step_seconds},
          {"tokens_per_s_per_gpu", f.tokens_per_s_per_gpu},
          {"tflops_per_gpu", f.tflops_per_gpu},
          {"mfu", f.mfu},
          {"peak_bytes", f.peak_bytes},
          {"fits", f.fits},
          {"planned_in_full", l.confirmed}};
  if (l.confirmed)
    out["estimated_step_seconds"] = l.estimated_step_seconds;
  return out;
}

void print_search(const nlohmann::json& doc) {
  fmt::print("meshsim plan --search: {} ({} parameters) on {}, {}, global batch {}\n",
             doc["preset"].get<std::string>().empty() ? doc["model"].get<std::string>()
                                                      : doc["preset"].get<std::string>(),
             short_count(doc["parameters"].get<int64_t>()), doc["cluster"].get<std::string>(),
             doc["precision"].get<std::string>(), doc["global_batch_size"].get<int64_t>());
  fmt::print("{} layouts: {} do not divide, {} planned, {} fit ({:.1f} s)\n",
             doc["candidates"].get<int>(), doc["invalid"].get<int>(), doc["planned"].get<int>(),
             doc["fitting"].get<int>(), doc["seconds"].get<double>());
  if (const int skipped = doc.value("allgather_skipped", 0); skipped > 0)
    fmt::print("{} tp × cp × pp searched with the ring exchange only (at the least memory it fit "
               "and was at least as fast as the all-gather)\n",
               skipped);
  if (doc["layouts"].empty()) {
    fmt::print("no layout fits\n");
  } else {
    fmt::print("{:>3} {:>3} {:<6} {:>3} {:>7} {:>4} {:>4} {:>6} {:<9} {:<3} {:>9} {:>12} {:>8} "
               "{:>6} {:>10}\n",
               "#", "tp", "cp", "pp", "dp", "zero", "mbs", "micro", "recompute", "sp", "step (s)",
               "tokens/s/GPU", "TFLOP/s", "MFU", "peak/GPU");
    for (const auto& l : doc["layouts"]) {
      const auto& y = l["layout"];
      // dp, or with HSDP its replicas × shard group ("2x8").
      const int dp = y["dp"].get<int>(), shard = y.value("dp_shard", dp);
      // and ep, carved out of it: "8 ep4".
      const int ep = y.value("ep", 1);
      const std::string dp_text =
          (shard == dp ? std::to_string(dp) : fmt::format("{}x{}", dp / shard, shard)) +
          (ep > 1 ? fmt::format(" ep{}", ep) : "");
      // cp, with its exchange: "4 ring" or "4 ag" (all-gather).
      const int cp = y.value("cp", 1);
      const std::string cp_text =
          cp == 1 ? "1"
                  : fmt::format("{} {}", cp, y.value("cp_comm", "") == "ring" ? "ring" : "ag");
      fmt::print("{:>3} {:>3} {:<6} {:>3} {:>7} {:>4} {:>4} {:>6} {:<9} {:<3} {:>9.3f} {:>12.0f} "
                 "{:>8.1f} {:>5.1f}% {:>10}{}\n",
                 l["rank"].get<int>(), y["tp"].get<int>(), cp_text, y["pp"].get<int>(), dp_text,
                 y["zero"].get<int>(), y["micro_batch_size"].get<int64_t>(),
                 y["micro_batches"].get<int>(), y["recompute"].get<std::string>(),
                 y["sequence_parallel"].get<bool>() ? "yes" : "no",
                 l["step_seconds"].get<double>(), l["tokens_per_s_per_gpu"].get<double>(),
                 l["tflops_per_gpu"].get<double>(), 100 * l["mfu"].get<double>(),
                 format_bytes(l["peak_bytes"].get<int64_t>()),
                 l["planned_in_full"].get<bool>() ? "  (planned in full)" : "");
    }
  }
  if (!doc["rejected"].empty()) {
    fmt::print("families (tp, cp, pp) with no layout that fits:\n");
    for (const auto& r : doc["rejected"])
      fmt::print("  {}: {}\n", r["family"].get<std::string>(), r["reason"].get<std::string>());
  }
}

} // namespace

int run_search(const TrainConfig& config, const ClusterSpec& cluster, const PlanArgs& args) {
  if (config.global_batch_size <= 0)
    throw std::invalid_argument("meshsim plan --search needs --global-batch-size (the batch every "
                                "layout must train on)");
  const RunClock clock;
  SearchOptions options;
  options.top = args.top;
  double last = 0;
  options.progress = [&](int estimated, int fitting) {
    if (clock.now() - last < 5)
      return;
    last = clock.now();
    fmt::print(stderr, "meshsim: search: {} layouts estimated, {} fit so far ({:.0f} s)\n",
               estimated, fitting, clock.now());
  };
  fmt::print(stderr, "meshsim: searching the layouts of {} on {}...\n",
             config.preset.empty() ? config.model : config.preset, cluster.to_string());
  const SearchResult r = search_layouts(config, cluster, options);
  nlohmann::json layouts = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (size_t i = 0; i < r.best.size(); ++i)
    layouts.push_back(row_json(r.best[i], static_cast<int>(i) + 1));
  for (const RejectedFamily& f : r.rejected)
    rejected.push_back({{"family", f.family}, {"reason", f.reason}, {"candidates", f.candidates}});
  const nlohmann::json doc{{"model", config.model},
                           {"preset", config.preset},
                           {"precision", config.precision},
                           {"parameters", preset_parameter_count(config.model, config.shape)},
                           {"cluster", cluster.to_string()},
                           {"gpu_memory_bytes", static_cast<int64_t>(cluster.gpu.mem_bytes)},
                           {"global_batch_size", config.global_batch_size},
                           {"candidates", r.candidates},
                           {"invalid", r.invalid},
                           {"planned", r.planned},
                           {"allgather_skipped", r.allgather_skipped},
                           {"fitting", r.fitting},
                           {"seconds", clock.now()},
                           {"layouts", layouts},
                           {"rejected", rejected}};
  if (!config.out.empty()) {
    // The ranking, and the fastest layout planned as `meshsim plan` with it would write it.
    std::filesystem::create_directories(config.out);
    write_file_atomic(std::filesystem::path(config.out) / "search.json", doc.dump(2) + "\n");
    if (!r.best.empty()) {
      TrainConfig best = r.best.front().config;
      best.out = config.out;
      plan_and_write(best, cluster, doc);
    } else {
      write_plan_page(std::filesystem::path(config.out) / "plan.html", nullptr, doc);
    }
  }
  if (args.json)
    fmt::print("{}\n", doc.dump(2));
  else
    print_search(doc);
  return kExitOk;
}

} // namespace meshsim
