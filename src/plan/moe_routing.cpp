// The routing a plan assumes for a mixture of experts (moe_routing.h).
#include "plan/moe_routing.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "base/errors.h"
#include "base/input_file.h"
#include "base/printable.h"

namespace meshsim {
namespace {

constexpr int64_t kMaxRoutingBytes = int64_t{256} << 20;
constexpr int64_t kMaxExperts = int64_t{1} << 16;

// A field of routing.csv: a non-negative decimal integer of at most 18 digits.
int64_t count_field(const std::string& field, const std::string& name, int64_t line) {
  if (field.empty() || field.size() > 18 ||
      !std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw DataError(fmt::format("{} line {}: '{}' is not a count", name, line,
                                printable(field.substr(0, 40))));
  return std::stoll(field);
}

// `sorted` (busiest first, summing to 1) spread over `experts`: the share of expert i is what
// the run's cumulative share gives between i/E and (i+1)/E, read linearly between its points.
std::vector<double> rescaled(const std::vector<double>& sorted, int64_t experts) {
  const double n = static_cast<double>(sorted.size());
  auto cumulative = [&](double x) { // the share of the busiest fraction x of the experts
    const double at = x * n;
    const auto whole = static_cast<size_t>(std::min(at, n));
    double sum = 0;
    for (size_t i = 0; i < whole; ++i)
      sum += sorted[i];
    if (whole < sorted.size())
      sum += sorted[whole] * (at - static_cast<double>(whole));
    return sum;
  };
  std::vector<double> out(static_cast<size_t>(experts));
  for (int64_t i = 0; i < experts; ++i)
    out[static_cast<size_t>(i)] = cumulative(static_cast<double>(i + 1) / experts) -
                                  cumulative(static_cast<double>(i) / experts);
  return out;
}

} // namespace

PlannedRouting routing_from_csv(const std::string& text, const std::string& name,
                                int64_t experts) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "step,rank,layer,expert,routed,ran")
    throw DataError(fmt::format("{}: not a routing.csv (its first line is not "
                                "step,rank,layer,expert,routed,ran)",
                                name));
  // (step, layer) -> expert -> assignments: sparse, so that no text makes a large table.
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, int64_t>> steps;
  int64_t run_experts = 0;
  for (int64_t number = 2; std::getline(in, line); ++number) {
    std::vector<std::string> f;
    size_t begin = 0;
    for (size_t comma; (comma = line.find(',', begin)) != std::string::npos; begin = comma + 1)
      f.push_back(line.substr(begin, comma - begin));
    f.push_back(line.substr(begin));
    if (f.size() != 6)
      throw DataError(fmt::format("{} line {}: {} fields, not 6", name, number, f.size()));
    const int64_t step = count_field(f[0], name, number), layer = count_field(f[2], name, number);
    count_field(f[1], name, number); // the rank
    const int64_t expert = count_field(f[3], name, number);
    const int64_t routed = count_field(f[4], name, number);
    if (!f[5].empty())
      count_field(f[5], name, number);
    if (expert >= kMaxExperts)
      throw DataError(fmt::format("{} line {}: expert {} is past the {} a layer may have", name,
                                  number, expert, kMaxExperts));
    int64_t& count = steps[{step, layer}][expert];
    if (count > (int64_t{1} << 62) - routed)
      throw DataError(fmt::format("{} line {}: the counts overflow", name, number));
    count += routed;
    run_experts = std::max(run_experts, expert + 1);
  }
  // The busiest step: its busiest expert's assignments over the mean, the highest of the run.
  double worst = 0;
  std::pair<int64_t, int64_t> at{-1, -1};
  std::vector<double> shares;
  for (const auto& [key, counts] : steps) {
    int64_t total = 0, most = 0;
    for (const auto& [expert, n] : counts) {
      if (total > (int64_t{1} << 62) - n)
        throw DataError(fmt::format("{}: the counts of step {} overflow", name, key.first));
      total += n;
      most = std::max(most, n);
    }
    if (total == 0)
      continue;
    const double ratio = static_cast<double>(most) * static_cast<double>(run_experts) /
                         static_cast<double>(total);
    if (ratio > worst) {
      worst = ratio, at = key;
      shares.assign(static_cast<size_t>(run_experts), 0.0);
      for (const auto& [expert, n] : counts)
        shares[static_cast<size_t>(expert)] = static_cast<double>(n) / static_cast<double>(total);
    }
  }
  if (shares.empty())
    throw DataError(fmt::format("{}: no step routed any token", name));
  std::sort(shares.rbegin(), shares.rend());
  PlannedRouting r;
  r.shares = rescaled(shares, experts);
  r.hottest = r.shares.front() * static_cast<double>(experts);
  r.description = fmt::format(
      "{}'s busiest step (step {}, layer {}: its busiest expert took {:.2f}x the mean), its {} "
      "experts' shares rescaled to {}: expert 0 takes {:.2f}x the mean",
      name, at.first, at.second, worst, run_experts, experts, r.hottest);
  return r;
}

PlannedRouting planned_routing(const std::string& routing, double imbalance, int64_t experts) {
  if (imbalance != 0 && routing != "balanced")
    throw std::invalid_argument("--moe-imbalance and --moe-routing RUN_DIR are two assumptions: "
                                "give one");
  if (imbalance != 0) {
    if (!(imbalance >= 1 && imbalance <= static_cast<double>(experts)))
      throw std::invalid_argument(fmt::format(
          "--moe-imbalance {} must be between 1 (balanced) and the {} experts (one takes all)",
          imbalance, experts));
    PlannedRouting r;
    const double e = static_cast<double>(experts);
    r.shares.assign(static_cast<size_t>(experts),
                    experts > 1 ? (1 - imbalance / e) / (e - 1) : 1.0);
    r.shares[0] = imbalance / e;
    r.hottest = imbalance;
    r.description = fmt::format("expert 0 of every layer takes {}x the mean (--moe-imbalance), "
                                "the others the rest in equal parts",
                                imbalance);
    return r;
  }
  if (routing == "balanced") {
    PlannedRouting r;
    r.description = "balanced: every expert takes k·N/E of a layer's N tokens' assignments";
    return r;
  }
  const std::filesystem::path csv = std::filesystem::path(routing) / "routing.csv";
  if (!std::filesystem::exists(csv))
    throw std::invalid_argument(fmt::format("--moe-routing {}: no routing.csv there (a mixture of experts' "
                                "run writes one; or give balanced)",
                                printable(routing)));
  return routing_from_csv(read_input_file(csv.string(), "routing.csv", kMaxRoutingBytes),
                          printable(csv.string()), experts);
}

} // namespace meshsim
