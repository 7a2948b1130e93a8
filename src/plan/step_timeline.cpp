// Each stage's predicted step split into compute, exposed communication and bubble.
#include "plan/step_timeline.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>
#include <set>
#include <string>

namespace meshsim {
namespace {

using Intervals = std::vector<std::pair<double, double>>;

// The union of `in`, sorted, clipped to [0, end].
Intervals merged(Intervals in, double end) {
  std::sort(in.begin(), in.end());
  Intervals out;
  for (auto [a, b] : in) {
    a = std::max(a, 0.0);
    b = std::min(b, end);
    if (b <= a)
      continue;
    if (!out.empty() && a <= out.back().second)
      out.back().second = std::max(out.back().second, b);
    else
      out.emplace_back(a, b);
  }
  return out;
}

// Whether `t` lies in `set` (sorted, disjoint); `at` walks forward as `t` grows.
bool covers(const Intervals& set, size_t& at, double t) {
  while (at < set.size() && set[at].second <= t)
    ++at;
  return at < set.size() && set[at].first <= t;
}

} // namespace

const char* activity_name(StepActivity a) {
  switch (a) {
  case StepActivity::Compute:
    return "compute";
  case StepActivity::ExposedComm:
    return "comm";
  case StepActivity::Bubble:
    return "bubble";
  }
  return "?";
}

StageTimeline split_step(Intervals compute, Intervals comm, double step_s, int max_segments) {
  StageTimeline out;
  if (step_s <= 0)
    return out;
  const Intervals c = merged(std::move(compute), step_s), m = merged(std::move(comm), step_s);
  std::vector<double> cuts{0.0, step_s};
  for (const Intervals* set : {&c, &m})
    for (auto [a, b] : *set) {
      cuts.push_back(a);
      cuts.push_back(b);
    }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

  // The exact pieces: between two cuts nothing changes, so the middle decides.
  std::vector<StepSegment> exact;
  size_t in_c = 0, in_m = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const double a = cuts[i], b = cuts[i + 1], mid = (a + b) / 2;
    const StepActivity what = covers(c, in_c, mid)   ? StepActivity::Compute
                              : covers(m, in_m, mid) ? StepActivity::ExposedComm
                                                     : StepActivity::Bubble;
    (what == StepActivity::Compute       ? out.compute_s
     : what == StepActivity::ExposedComm ? out.exposed_comm_s
                                         : out.bubble_s) += b - a;
    if (!exact.empty() && exact.back().activity == what)
      exact.back().end_s = b;
    else
      exact.push_back({a, b, what});
  }
  if (max_segments <= 0 || static_cast<int>(exact.size()) <= max_segments) {
    out.segments = std::move(exact);
    return out;
  }
  // Too many to draw: equal slices, each what filled most of it.
  const double width = step_s / max_segments;
  size_t at = 0;
  for (int k = 0; k < max_segments; ++k) {
    const double a = k * width, b = k + 1 == max_segments ? step_s : (k + 1) * width;
    std::array<double, 3> filled{};
    while (at < exact.size() && exact[at].end_s <= a)
      ++at;
    for (size_t j = at; j < exact.size() && exact[j].start_s < b; ++j)
      filled[static_cast<size_t>(exact[j].activity)] +=
          std::min(b, exact[j].end_s) - std::max(a, exact[j].start_s);
    const auto what =
        static_cast<StepActivity>(std::max_element(filled.begin(), filled.end()) - filled.begin());
    if (!out.segments.empty() && out.segments.back().activity == what)
      out.segments.back().end_s = b;
    else
      out.segments.push_back({a, b, what});
  }
  return out;
}

std::vector<StageTimeline> stage_timelines(const Plan& plan, const Prediction& prediction,
                                           int max_segments) {
  const ReplayResult& replay = prediction.replay;
  // A send is its receiver's transfer: the receiver waits on it, the sender does not (as the
  // replay's RankStats count it).
  std::set<std::string> sends;
  for (size_t rank = 0; rank < prediction.program.ranks.size(); ++rank)
    for (const Task& task : prediction.program.ranks[rank])
      if (task.kind == TaskKind::Comm && task.op == CollectiveOp::SendRecv &&
          task.group.size() == 2 && task.group[0] == static_cast<int>(rank) &&
          task.group[1] != task.group[0])
        sends.insert(task.id);
  // Each rank's compute and communication intervals, in one pass over the replay.
  std::map<int, std::pair<Intervals, Intervals>> by_rank;
  for (const TaskTiming& t : replay.tasks) {
    if (t.kind == TaskKind::Comm && sends.count(t.id))
      continue;
    auto& [compute, comm] = by_rank[t.rank];
    (t.kind == TaskKind::Compute ? compute : comm).emplace_back(t.start_s, t.end_s);
  }
  std::vector<StageTimeline> out;
  for (const PlannedRank& r : plan.ranks) {
    // An image stage with no tasks of its own takes those of the rank it is an image of.
    auto found = by_rank.find(r.rank);
    if ((found == by_rank.end() || found->second.first.empty()) && r.image_of >= 0)
      found = by_rank.find(r.image_of);
    Intervals compute, comm;
    if (found != by_rank.end())
      std::tie(compute, comm) = found->second;
    StageTimeline t =
        split_step(std::move(compute), std::move(comm), replay.makespan_s, max_segments);
    t.stage = r.coord.pp;
    t.rank = r.rank;
    out.push_back(std::move(t));
  }
  return out;
}

} // namespace meshsim
