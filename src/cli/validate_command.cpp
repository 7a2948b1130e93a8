// `meshsim validate`: every published row the cost model is held against, predicted with its
// publication's configuration, with the error; calibration rows marked. See plan/validation.h.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "plan/validation.h"

namespace meshsim {

void add_validate_flags(CLI::App& app, ValidateArgs& a) {
  app.add_option("--only", a.only,
                 "rows of these sources only: nccl (nccl-tests), deepep, narayanan (Megatron-LM "
                 "Table 1), pytorch (the PyTorch DDP benchmark), megatron-lm (its README's H100 "
                 "table), megatron-bridge, nemo (AutoModel and the long-sequence table), "
                 "torchtitan")
      ->delimiter(',')
      ->check(CLI::IsMember({"nccl", "deepep", "narayanan", "pytorch", "megatron-lm",
                             "megatron-bridge", "nemo", "torchtitan"}));
  app.add_option("--family", a.family,
                 "rows of these families only: dense (bf16 on H100), fp8, moe, long (context), "
                 "a100 (the A100/V100 rows of 2019-2021), collectives")
      ->delimiter(',')
      ->check(CLI::IsMember({"dense", "fp8", "moe", "long", "a100", "collectives"}));
  app.add_flag("--json", a.json, "print the rows and the summary as JSON");
  app.add_option("--matmul-efficiency", a.matmul_efficiency,
                 "try this large-GEMM efficiency (every GPU but Hopper) instead of the calibrated "
                 "one (0 < E <= 1)")
      ->check(CLI::Range(1e-9, 1.0));
  app.add_option("--hopper-efficiency", a.hopper_efficiency,
                 "try this large-GEMM efficiency on Hopper GPUs (H100, H200, H800) instead of the "
                 "calibrated one (0 < E <= 1)")
      ->check(CLI::Range(1e-9, 1.0));
  app.add_option("--fp8-efficiency", a.fp8_efficiency,
                 "try this large FP8 GEMM efficiency instead of the calibrated one (0 < E <= 1)")
      ->check(CLI::Range(1e-9, 1.0));
  app.add_option("--gemm-half-us", a.gemm_half_us,
                 "try this GEMM half-efficiency time in microseconds (>= 0)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("!--no-progress", a.progress, "do not report each row on stderr");
}

namespace {

// One decimal, or three significant digits below 1 (0.097 s per iteration).
std::string format_value(double v) {
  return v < 1 ? fmt::format("{:.3f}", v) : fmt::format("{:.1f}", v);
}

} // namespace

int run_validate(const ValidateArgs& a) {
  Efficiency efficiency;
  if (a.matmul_efficiency > 0)
    efficiency.matmul = a.matmul_efficiency;
  if (a.hopper_efficiency > 0)
    efficiency.hopper_matmul = a.hopper_efficiency;
  if (a.fp8_efficiency > 0)
    efficiency.fp8_matmul = a.fp8_efficiency;
  if (a.gemm_half_us >= 0)
    efficiency.gemm_half_s = a.gemm_half_us * 1e-6;
  // Each --family word is the start of its family's name ("a100": "A100/V100 (2019-2021)").
  const std::vector<PublishedRow> rows = published_rows(a.only, efficiency, a.family);
  const ValidationSummary s = validate_rows(rows, [&](size_t i, size_t n, const PublishedRow& row) {
    if (a.progress)
      fmt::print(stderr, "meshsim validate: [{}/{}] {}\n", i + 1, n, row.name);
  });
  for (const RowResult& r : s.rows)
    if (!r.failure.empty())
      fmt::print(stderr, "meshsim: validate: {}: {}\n", r.row->name, r.failure);
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const RowResult& r : s.rows)
      out.push_back({{"group", r.row->group},
                     {"family", r.row->family},
                     {"row", r.row->name},
                     {"source", r.row->source},
                     {"unit", r.row->unit},
                     {"published_low", r.row->low},
                     {"published_high", r.row->high},
                     {"predicted", r.predicted},
                     {"error", r.error},
                     {"calibration", r.row->calibration()},
                     {"fitted", r.row->fitted},
                     {"failure", r.failure}});
    nlohmann::json families = nlohmann::json::array();
    for (const ErrorSummary& f : s.families)
      families.push_back({{"family", f.family},
                          {"held_out", f.held_out},
                          {"held_out_mean_abs_error", f.held_out_mean_abs},
                          {"held_out_worst_abs_error", f.held_out_worst},
                          {"calibration", f.calibration},
                          {"calibration_mean_abs_error", f.calibration_mean_abs}});
    fmt::print("{}\n", nlohmann::json{{"rows", out},
                                      {"families", families},
                                      {"held_out", s.held_out},
                                      {"held_out_mean_abs_error", s.held_out_mean_abs},
                                      {"held_out_worst_abs_error", s.held_out_worst},
                                      {"calibration_mean_abs_error", s.calibration_mean_abs},
                                      {"failed", s.failed}}
                           .dump(2));
    return s.failed > 0 ? kExitFailure : kExitOk;
  }
  for (const ErrorSummary& f : s.families) {
    fmt::print("\n## {}\n\n", f.family);
    fmt::print("| row | source | unit | published | predicted | error | set |\n");
    fmt::print("|---|---|---|---:|---:|---:|---|\n");
    for (const RowResult& r : s.rows) {
      if (r.row->family != f.family)
        continue;
      const std::string published = r.row->low == r.row->high
                                        ? format_value(r.row->low)
                                        : fmt::format("{:.0f}–{:.0f}", r.row->low, r.row->high);
      const std::string set =
          r.row->calibration() ? "calibration (" + r.row->fitted + ")" : "held out";
      if (!r.failure.empty())
        fmt::print("| {} | {} | {} | {} | failed: {} | | {} |\n", r.row->name, r.row->source,
                   r.row->unit, published, r.failure, set);
      else
        fmt::print("| {} | {} | {} | {} | {} | {:+.1f} % | {} |\n", r.row->name, r.row->source,
                   r.row->unit, published, format_value(r.predicted), 100 * r.error, set);
    }
    fmt::print("\n{}: held out {} rows, mean |error| {:.1f} %, worst {:.1f} %{}\n", f.family,
               f.held_out, 100 * f.held_out_mean_abs, 100 * f.held_out_worst,
               f.calibration > 0 ? fmt::format("; calibration {} rows, mean |error| {:.1f} %",
                                               f.calibration, 100 * f.calibration_mean_abs)
                                 : std::string());
  }
  fmt::print("\n| family | held out | mean \\|error\\| | worst | target met (5 %, 10 %) |\n");
  fmt::print("|---|---:|---:|---:|---|\n");
  for (const ErrorSummary& f : s.families)
    fmt::print("| {} | {} | {:.1f} % | {:.1f} % | {} |\n", f.family, f.held_out,
               100 * f.held_out_mean_abs, 100 * f.held_out_worst,
               f.held_out == 0 ? "no held-out rows"
               : f.held_out_mean_abs <= 0.05 && f.held_out_worst <= 0.10 ? "yes"
                                                                           : "no");
  fmt::print("\nheld out: {} rows, mean |error| {:.1f} %, worst {:.1f} % (targets 5 % and 10 % "
             "for each family); calibration rows: mean |error| {:.1f} %\n",
             s.held_out, 100 * s.held_out_mean_abs, 100 * s.held_out_worst,
             100 * s.calibration_mean_abs);
  if (s.failed > 0) {
    fmt::print("{} row(s) could not be predicted (above)\n", s.failed);
    return kExitFailure;
  }
  return kExitOk;
}

} // namespace meshsim
