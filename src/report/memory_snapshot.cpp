#include "report/memory_snapshot.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "mesh/device_mesh.h"
#include "base/atomic_file.h"
#include "base/pickle.h"

namespace meshsim {
namespace {

constexpr int64_t kSmallBlock = 1 << 20; // PyTorch's small pool: blocks up to 1 MiB

struct PhaseMark {
  double time_s;
  int64_t step;
  std::string phase;
};

// The phases `rank` ended, in time order: its own samples, or every sample when it took none
// (DataParallel's one controlling thread samples for all).
std::vector<PhaseMark> phases_of(const std::vector<MemorySample>& samples, int rank) {
  const bool own = std::any_of(samples.begin(), samples.end(),
                               [&](const MemorySample& s) { return s.rank == rank; });
  std::vector<PhaseMark> marks;
  for (const auto& s : samples)
    if (!own || s.rank == rank) marks.push_back({s.time_s, s.step, s.phase});
  std::stable_sort(marks.begin(), marks.end(),
                   [](const PhaseMark& a, const PhaseMark& b) { return a.time_s < b.time_s; });
  return marks;
}

nlohmann::json frames(MemoryCategory category, const std::vector<PhaseMark>& marks,
                      double time_s) {
  if (time_s < 0) // allocated before the steps the history kept
    return nlohmann::json::array(
        {{{"name", category_name(category)}, {"filename", "category"}, {"line", 0}},
         {{"name", "before the steps kept"}, {"filename", "step"}, {"line", 0}}});
  const auto next = std::lower_bound(marks.begin(), marks.end(), time_s,
                                     [](const PhaseMark& m, double t) { return m.time_s < t; });
  nlohmann::json phase;
  if (next != marks.end())
    phase = {{"name", next->phase}, {"filename", "step"}, {"line", next->step}};
  else if (!marks.empty())
    phase = {{"name", "after the last phase"}, {"filename", "step"}, {"line", marks.back().step}};
  else
    phase = {{"name", "setup"}, {"filename", "step"}, {"line", 0}};
  return nlohmann::json::array(
      {{{"name", category_name(category)}, {"filename", "category"}, {"line", 0}}, phase});
}

int64_t micros(double seconds) { return static_cast<int64_t>(std::llround(seconds * 1e6)); }

} // namespace

nlohmann::json memory_snapshot(const AllocationHistory& history,
                               const std::vector<MemorySample>& samples, int rank) {
  const auto marks = phases_of(samples, rank);
  // The snapshot is taken at the end of the last training step (its last sample): what the
  // run did after it (the final evaluation, tearing the model down) is undone, newest first.
  double end = -1;
  for (const auto& s : samples)
    if (s.step >= 1) end = std::max(end, s.time_s);
  std::vector<AllocationEvent> events = history.events();
  std::map<uint64_t, LiveBlock> live;
  for (const LiveBlock& b : history.live()) live[b.address] = b;
  if (end >= 0) {
    for (auto e = events.rbegin(); e != events.rend() && e->time_s > end; ++e) {
      if (e->alloc)
        live.erase(e->address);
      else
        live[e->address] = {e->address, e->size, e->category, -1.0};
    }
    events.erase(std::upper_bound(events.begin(), events.end(), end,
                                  [](double t, const AllocationEvent& e) { return t < e.time_s; }),
                 events.end());
  }
  // Blocks freed later but allocated inside the window carry their allocation's time.
  for (const AllocationEvent& e : events)
    if (e.alloc)
      if (auto b = live.find(e.address); b != live.end() && b->second.since_s < 0)
        b->second.since_s = e.time_s;
  nlohmann::json segments = nlohmann::json::array();
  for (const auto& [address, b] : live) {
    const auto f = frames(b.category, marks, b.since_s);
    const nlohmann::json block = {
        {"address", b.address}, {"size", b.size}, {"requested_size", b.size},
        {"state", "active_allocated"}, {"frames", f},
        {"history", nlohmann::json::array({{{"addr", b.address}, {"real_size", b.size}, {"frames", f}}})}};
    segments.push_back({{"device", 0},
                        {"address", b.address},
                        {"total_size", b.size},
                        {"allocated_size", b.size},
                        {"active_size", b.size},
                        {"requested_size", b.size},
                        {"stream", 0},
                        {"segment_type", b.size <= kSmallBlock ? "small" : "large"},
                        {"segment_pool_id", nlohmann::json::array({0, 0})},
                        {"is_expandable", false},
                        {"frames", f},
                        {"blocks", nlohmann::json::array({block})}});
  }
  nlohmann::json trace = nlohmann::json::array();
  for (const AllocationEvent& e : events) {
    const auto f = frames(e.category, marks, e.time_s);
    auto event = [&](const char* action) {
      return nlohmann::json{{"action", action}, {"addr", e.address}, {"size", e.size},
                            {"stream", 0},      {"time_us", micros(e.time_s)}, {"frames", f}};
    };
    if (e.alloc) {
      trace.push_back(event("alloc"));
    } else {
      trace.push_back(event("free_requested"));
      trace.push_back(event("free_completed"));
    }
  }
  return {{"segments", segments},
          {"device_traces", nlohmann::json::array({trace})},
          {"allocator_settings", nlohmann::json::object()}};
}

void write_memory_snapshots(const std::filesystem::path& dir, const DeviceMesh& mesh) {
  const auto samples = mesh.timeline().samples();
  for (int r = 0; r < mesh.world_size(); ++r) {
    const AllocationHistory* history = mesh.history(r);
    if (history == nullptr)
      continue;
    std::filesystem::create_directories(dir);
    write_file_atomic(dir / ("gpu" + std::to_string(r) + ".pickle"),
                      to_pickle(memory_snapshot(*history, samples, r)));
  }
}

} // namespace meshsim
