// report.html's data: what each chart needs, thinned to fit the page (see report_data.h).
#include "report/report_data.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

namespace meshsim {
namespace {

// A sample's bytes of one GPU by category; a sample made without them holds all in "other".
CategoryBytes bytes_of(const MemorySample& s, size_t gpu) {
  if (gpu < s.by_category.size())
    return s.by_category[gpu];
  CategoryBytes b{};
  if (gpu < s.bytes.size())
    b[static_cast<size_t>(MemoryCategory::Other)] = s.bytes[gpu];
  return b;
}

double round_ms(double seconds) {
  return std::round(seconds * 1e6) / 1e3;
}

// Indices of the samples of each step, in time order.
std::map<int64_t, std::vector<size_t>> samples_by_step(const std::vector<MemorySample>& samples) {
  std::map<int64_t, std::vector<size_t>> out;
  for (size_t i = 0; i < samples.size(); ++i)
    out[samples[i].step].push_back(i);
  for (auto& [step, idx] : out)
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return samples[a].time_s < samples[b].time_s; });
  return out;
}

// One GPU over one step: the points where its bytes changed, the first and the last.
struct Series {
  std::vector<size_t> points; // sample indices
  std::vector<CategoryBytes> bytes;
};

Series series_of(const std::vector<MemorySample>& samples, const std::vector<size_t>& step,
                 size_t gpu) {
  Series s;
  for (size_t k = 0; k < step.size(); ++k) {
    const CategoryBytes b = bytes_of(samples[step[k]], gpu);
    const bool last = k + 1 == step.size();
    if (s.bytes.empty() || b != s.bytes.back() || last) {
      s.points.push_back(step[k]);
      s.bytes.push_back(b);
    }
  }
  return s;
}

// The sample (of `idx`) where `gpu` held the most, and its bytes.
CategoryBytes peak_of(const std::vector<MemorySample>& samples, const std::vector<size_t>& idx,
              size_t gpu) {
  CategoryBytes best{};
  int64_t best_total = -1;
  for (size_t i : idx) {
    const CategoryBytes b = bytes_of(samples[i], gpu);
    if (category_total(b) > best_total)
      best = b, best_total = category_total(b);
  }
  return best;
}

} // namespace

int64_t report_representative_step(const std::vector<MemorySample>& samples) {
  std::set<int64_t> steps;
  for (const auto& s : samples)
    if (s.step > 0)
      steps.insert(s.step);
  if (steps.empty())
    return samples.empty() ? -1 : samples.front().step;
  if (steps.size() == 1)
    return *steps.begin();
  return *std::prev(steps.end(), 2);
}

nlohmann::json memory_report_data(const std::vector<MemorySample>& samples,
                                  const std::vector<int64_t>& capacities,
                                  const std::vector<GpuPeak>& peaks, const ReportLimits& limits) {
  const size_t gpus = capacities.size();
  const auto by_step = samples_by_step(samples);
  std::vector<size_t> all(samples.size());
  std::iota(all.begin(), all.end(), size_t{0});
  const int64_t rep = report_representative_step(samples);

  // Identical GPUs are drawn once: DDP's replicas are one group, a pipeline's stages not.
  std::vector<CategoryBytes> run_peak(gpus);
  std::map<std::vector<CategoryBytes>, int> signature_group;
  std::vector<int> group_of(gpus, 0);
  std::vector<std::vector<int>> groups;
  for (size_t g = 0; g < gpus; ++g) {
    run_peak[g] = peak_of(samples, all, g);
    std::vector<CategoryBytes> signature = {CategoryBytes{capacities[g]}};
    if (peaks.size() == gpus) {
      signature.push_back(peaks[g].by_category);
      signature.push_back(CategoryBytes{peaks[g].bytes});
    } else {
      if (by_step.count(rep))
        signature = series_of(samples, by_step.at(rep), g).bytes;
      signature.push_back(run_peak[g]);
      signature.push_back(CategoryBytes{capacities[g]});
    }
    auto [it, fresh] = signature_group.emplace(signature, static_cast<int>(groups.size()));
    if (fresh)
      groups.emplace_back();
    groups[it->second].push_back(static_cast<int>(g));
    group_of[g] = it->second;
  }

  nlohmann::json phases = nlohmann::json::array();
  std::map<std::string, int> phase_index;
  auto phase_of = [&](const std::string& name) {
    auto [it, fresh] = phase_index.emplace(name, static_cast<int>(phase_index.size()));
    if (fresh)
      phases.push_back(name);
    return it->second;
  };
  // One step's detail: per group, [time_ms, phase, bytes by category...] at each change.
  auto detail_of = [&](const std::vector<size_t>& idx) {
    nlohmann::json per_group = nlohmann::json::array();
    const double t0 = samples[idx.front()].time_s;
    for (const auto& members : groups) {
      const Series s = series_of(samples, idx, static_cast<size_t>(members.front()));
      nlohmann::json rows = nlohmann::json::array();
      for (size_t k = 0; k < s.points.size(); ++k) {
        const MemorySample& m = samples[s.points[k]];
        nlohmann::json row = {round_ms(m.time_s - t0), phase_of(m.phase)};
        for (int64_t b : s.bytes[k])
          row.push_back(b);
        rows.push_back(std::move(row));
      }
      per_group.push_back(std::move(rows));
    }
    return per_group;
  };

  // Detail for the representative step always, then for evenly spaced steps while the
  // budget lasts (every step when it fits).
  nlohmann::json detail = nlohmann::json::object();
  std::vector<int64_t> steps;
  for (const auto& [step, idx] : by_step)
    steps.push_back(step);
  if (!steps.empty()) {
    const int64_t first = rep >= 0 && by_step.count(rep) ? rep : steps.back();
    detail[std::to_string(first)] = detail_of(by_step.at(first));
    const double one = static_cast<double>(detail.dump().size());
    const size_t fit = static_cast<size_t>(
        std::max(1.0, std::floor(static_cast<double>(limits.detail_budget_bytes) / one)));
    const size_t take = std::min(steps.size(), fit);
    for (size_t k = 0; k < take; ++k) {
      const size_t at = take == 1 ? 0 : k * (steps.size() - 1) / (take - 1);
      const std::string key = std::to_string(steps[at]);
      if (!detail.contains(key))
        detail[key] = detail_of(by_step.at(steps[at]));
    }
  }

  // The run: each column a bin of consecutive steps, each group's most-held sample in it.
  const int64_t per_column = static_cast<int64_t>(groups.size()) * (kNumCategories + 2);
  const size_t columns = std::min<size_t>(
      steps.size(), static_cast<size_t>(std::clamp<int64_t>(limits.strip_budget_values /
                                                                std::max<int64_t>(1, per_column),
                                                            50, limits.max_strip_columns)));
  nlohmann::json strip = nlohmann::json::array();
  for (const auto& members : groups) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t c = 0; c < columns; ++c) {
      const size_t lo = c * steps.size() / columns, hi = (c + 1) * steps.size() / columns;
      std::vector<size_t> idx;
      for (size_t k = lo; k < hi; ++k)
        for (size_t i : by_step.at(steps[k]))
          idx.push_back(i);
      nlohmann::json row = {steps[lo], steps[hi - 1]};
      for (int64_t b : peak_of(samples, idx, static_cast<size_t>(members.front())))
        row.push_back(b);
      rows.push_back(std::move(row));
    }
    strip.push_back(std::move(rows));
  }

  nlohmann::json peak_json = nlohmann::json::array();
  for (size_t g = 0; g < gpus; ++g)
    peak_json.push_back({{"sampled", run_peak[g]},
                         {"peak", peaks.size() == gpus ? peaks[g].bytes : category_total(run_peak[g])},
                         {"capacity", capacities[g]}});
  return {{"gpus", gpus},     {"groups", groups},           {"group_of", group_of},
          {"phases", phases}, {"representative_step", rep}, {"detail", detail},
          {"strip", strip},   {"peaks", peak_json}};
}

std::string group_label(const std::vector<int>& ranks) {
  if (ranks.empty())
    return "none";
  if (ranks.size() == 1)
    return std::to_string(ranks[0]);
  bool progression = true;
  const int stride = ranks[1] - ranks[0];
  for (size_t i = 1; i < ranks.size(); ++i)
    progression &= ranks[i] - ranks[i - 1] == stride;
  if (progression && stride == 1)
    return fmt::format("{}-{}", ranks.front(), ranks.back());
  if (progression && ranks.size() > 3)
    return fmt::format("{},{},…,{}", ranks[0], ranks[1], ranks.back());
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

nlohmann::json collectives_report_data(const std::vector<Recorder>& recorders) {
  struct Tally {
    int64_t calls = 0, bytes = 0, size = 0;
    double seconds = 0;
    std::map<int, int64_t> by_size; // floor(log2(bytes)), -1 for none
  };
  std::map<std::pair<std::string, std::string>, Tally> tally; // (group, op)
  for (size_t r = 0; r < recorders.size(); ++r)
    for (const auto& c : recorders[r].collectives) {
      std::string label;
      int64_t size = static_cast<int64_t>(c.group.size());
      if (c.op == "send") {
        label = fmt::format("{}→{}", r, c.peer);
        size = 2;
      } else if (c.op == "recv" || c.group.empty() || c.group.front() != static_cast<int>(r)) {
        continue;
      } else {
        label = group_label(c.group);
      }
      Tally& t = tally[{label, c.op}];
      t.calls += 1;
      t.bytes += c.bytes;
      t.size = size;
      t.seconds += c.end_s - c.start_s;
      t.by_size[c.bytes > 0 ? static_cast<int>(std::floor(std::log2(static_cast<double>(c.bytes))))
                            : -1] += 1;
    }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, t] : tally) {
    nlohmann::json sizes = nlohmann::json::array();
    for (const auto& [bin, calls] : t.by_size)
      sizes.push_back({bin, calls});
    out.push_back({{"group", key.first},
                   {"op", key.second},
                   {"ranks", t.size},
                   {"calls", t.calls},
                   {"bytes", t.bytes},
                   {"seconds", t.seconds},
                   {"sizes", sizes}});
  }
  return out;
}

nlohmann::json metrics_report_data(const std::vector<nlohmann::json>& lines, int max_points) {
  std::vector<const nlohmann::json*> rows;
  for (const auto& l : lines)
    if (l.is_object() && l.contains("step") && l["step"].is_number())
      rows.push_back(&l);
  const size_t keep = std::min(rows.size(), static_cast<size_t>(std::max(2, max_points)));
  nlohmann::json out = nlohmann::json::array();
  auto number = [](const nlohmann::json& l, const char* key) {
    return l.contains(key) && l[key].is_number() ? l[key] : nlohmann::json(nullptr);
  };
  for (size_t k = 0; k < keep; ++k) {
    const size_t at = keep == 1 ? 0 : k * (rows.size() - 1) / (keep - 1);
    const auto& l = *rows[at];
    out.push_back({l["step"], number(l, "loss"), number(l, "samples_per_s"), number(l, "lr")});
  }
  return out;
}

} // namespace meshsim
