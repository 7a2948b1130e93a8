// The routing a run recorded, as routing.csv and as summary.json's "routing" (routing.h).
#include "report/routing.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace meshsim {

std::string routing_csv(std::vector<RoutingRecord> records) {
  std::sort(records.begin(), records.end(), [](const RoutingRecord& a, const RoutingRecord& b) {
    return std::tie(a.step, a.rank, a.layer) < std::tie(b.step, b.rank, b.layer);
  });
  std::string out = "step,rank,layer,expert,routed,ran\n";
  for (const RoutingRecord& r : records)
    for (size_t e = 0; e < r.routed.size(); ++e) {
      const int64_t held = static_cast<int64_t>(e) - r.first_expert;
      const bool holds = held >= 0 && held < static_cast<int64_t>(r.ran.size());
      out += fmt::format("{},{},{},{},{},{}\n", r.step, r.rank, r.layer, e, r.routed[e],
                         holds ? std::to_string(r.ran[static_cast<size_t>(held)]) : "");
    }
  return out;
}

nlohmann::json routing_summary(const std::vector<RoutingRecord>& records) {
  if (records.empty())
    return nullptr;
  const size_t experts = records.front().routed.size();
  std::map<int64_t, std::vector<int64_t>> totals;                 // layer -> [E]
  std::map<int64_t, std::map<int64_t, std::vector<int64_t>>> by_step; // layer -> step -> [E]
  std::map<int, std::pair<int64_t, nlohmann::json>> ranks;        // rank -> (rows ran, experts)
  std::map<int, std::map<int64_t, int64_t>> rank_steps;            // rank -> step -> rows ran
  for (const RoutingRecord& r : records) {
    auto& total = totals[r.layer];
    auto& step = by_step[r.layer][r.step];
    total.resize(experts, 0);
    step.resize(experts, 0);
    for (size_t e = 0; e < experts && e < r.routed.size(); ++e) {
      total[e] += r.routed[e];
      step[e] += r.routed[e];
    }
    auto& rank = ranks[r.rank];
    for (int64_t n : r.ran) {
      rank.first += n;
      rank_steps[r.rank][r.step] += n;
    }
    rank.second = {r.first_expert, r.first_expert + static_cast<int64_t>(r.ran.size()) - 1};
  }
  nlohmann::json layers = nlohmann::json::array(), tokens = nlohmann::json::object(),
                 imbalance = nlohmann::json::object(), steps = nlohmann::json::array();
  for (const auto& [layer, total] : totals) {
    layers.push_back(layer);
    tokens[std::to_string(layer)] = total;
    nlohmann::json per_step = nlohmann::json::array();
    for (const auto& [step, counts] : by_step[layer]) {
      int64_t sum = 0, most = 0;
      for (int64_t n : counts) {
        sum += n;
        most = std::max(most, n);
      }
      per_step.push_back(sum > 0 ? static_cast<double>(most) * static_cast<double>(experts) /
                                       static_cast<double>(sum)
                                 : 0.0);
    }
    imbalance[std::to_string(layer)] = per_step;
  }
  for (const auto& [step, counts] : by_step.begin()->second)
    steps.push_back(step);
  nlohmann::json rank_rows = nlohmann::json::array();
  for (const auto& [rank, load] : ranks) {
    int64_t busiest = 0;
    for (const auto& [step, n] : rank_steps[rank])
      busiest = std::max(busiest, n);
    rank_rows.push_back({{"rank", rank},
                         {"rows_ran", load.first},
                         {"most_rows_in_a_step", busiest},
                         {"experts", load.second}});
  }
  return {{"experts", experts},    {"layers", layers},        {"steps", steps},
          {"tokens_per_expert", tokens}, {"imbalance", imbalance}, {"ranks", rank_rows}};
}

} // namespace meshsim
