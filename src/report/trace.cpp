// chrome_trace, write_chrome_trace and validate_chrome_trace: Recorder and MemorySample
// data to the Chrome Trace Event Format, and a checker for that format.
#include "report/trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "base/atomic_file.h"

namespace meshsim {
namespace {

using nlohmann::json;

constexpr int kComputeTid = 0;
constexpr int kCommTid = 1;
constexpr size_t kMaxProblems = 50;

/// Seconds to microseconds, clamped to >= 0 (the format has no negative times or durations).
double to_us(double seconds) {
  const double us = seconds * 1e6;
  return std::isfinite(us) && us > 0 ? us : 0.0;
}

json metadata(const std::string& name, int pid, int tid, json args) {
  return {{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

json complete(const std::string& name, const char* cat, int pid, int tid, double start_s,
              double end_s, json args) {
  return {{"ph", "X"},
          {"name", name},
          {"cat", cat},
          {"pid", pid},
          {"tid", tid},
          {"ts", to_us(start_s)},
          {"dur", to_us(end_s - start_s)},
          {"args", std::move(args)}};
}

std::string join_ranks(const std::vector<int>& group) {
  std::string out;
  for (size_t i = 0; i < group.size(); ++i) {
    if (i > 0)
      out += ',';
    out += std::to_string(group[i]);
  }
  return out;
}

/// At most kMaxProblems lines: the first ones found, then a count of the rest.
std::vector<std::string> capped(std::vector<std::string> problems) {
  if (problems.size() <= kMaxProblems)
    return problems;
  const size_t more = problems.size() - (kMaxProblems - 1);
  problems.resize(kMaxProblems - 1);
  problems.push_back("... and " + std::to_string(more) + " more problems");
  return problems;
}

bool is_finite_number(const json& v) {
  return v.is_number() && std::isfinite(v.get<double>());
}

std::string at(size_t i) {
  return "traceEvents[" + std::to_string(i) + "]: ";
}

} // namespace

json chrome_trace(const std::vector<Recorder>& ranks, const std::vector<MemorySample>& memory,
                  const std::string& label, int pid_offset) {
  if (pid_offset < 0)
    throw std::invalid_argument("chrome_trace: negative pid_offset");
  const int num_gpus = static_cast<int>(ranks.size());
  for (const MemorySample& s : memory) {
    if (s.bytes.size() != ranks.size()) {
      throw std::invalid_argument("chrome_trace: a memory sample has " +
                                  std::to_string(s.bytes.size()) + " byte counts for " +
                                  std::to_string(num_gpus) + " GPUs");
    }
  }
  json events = json::array();
  for (int r = 0; r < num_gpus; ++r) {
    const int pid = r + pid_offset;
    const std::string gpu = "gpu" + std::to_string(r);
    const std::string process = label.empty() ? gpu : gpu + " (" + label + ")";
    events.push_back(metadata("process_name", pid, 0, {{"name", process}}));
    events.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}));
    events.push_back(metadata("thread_name", pid, kComputeTid, {{"name", "compute"}}));
    events.push_back(metadata("thread_sort_index", pid, kComputeTid, {{"sort_index", 0}}));
    events.push_back(metadata("thread_name", pid, kCommTid, {{"name", "communication"}}));
    events.push_back(metadata("thread_sort_index", pid, kCommTid, {{"sort_index", 1}}));
  }
  for (int r = 0; r < num_gpus; ++r) {
    const int pid = r + pid_offset;
    for (const ComputeRecord& c : ranks[r].compute) {
      events.push_back(
          complete(c.name, "compute", pid, kComputeTid, c.start_s, c.end_s, {{"step", c.step}}));
    }
    for (const CollectiveRecord& c : ranks[r].collectives) {
      json args = {
          {"bytes", c.bytes}, {"group", join_ranks(c.group)}, {"seq", c.seq}, {"peer", c.peer}};
      events.push_back(complete(c.op, "comm", pid, kCommTid, c.start_s, c.end_s, std::move(args)));
    }
  }
  for (const MemorySample& s : memory) {
    for (int r = 0; r < num_gpus; ++r) {
      const double mib = static_cast<double>(s.bytes[r]) / kMiB;
      events.push_back({{"ph", "C"},
                        {"name", "memory (MiB)"},
                        {"pid", r + pid_offset},
                        {"tid", kComputeTid},
                        {"ts", to_us(s.time_s)},
                        {"args", {{"gpu" + std::to_string(r), mib}}}});
    }
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"generator", "meshsim"},
            {"label", label},
            {"num_gpus", num_gpus},
            {"pid_offset", pid_offset}}}};
}

void write_chrome_trace(const std::filesystem::path& path, const json& trace) {
  write_file_atomic(path, trace.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
}

std::vector<std::string> validate_chrome_trace(const json& trace) {
  std::vector<std::string> problems;
  auto add = [&](const std::string& line) { problems.push_back(line); };
  const json* events = &trace;
  if (trace.is_object()) {
    auto it = trace.find("traceEvents");
    if (it == trace.end() || !it->is_array()) {
      add("no traceEvents array");
      return capped(std::move(problems));
    }
    events = &*it;
    auto unit = trace.find("displayTimeUnit");
    if (unit != trace.end() && !(unit->is_string() && (*unit == "ms" || *unit == "ns"))) {
      add("displayTimeUnit is not \"ms\" or \"ns\"");
    }
  } else if (!trace.is_array()) {
    add("trace is neither an object nor an array");
    return capped(std::move(problems));
  }

  static const std::string kPhases = "XBECMiI";
  static const std::vector<std::string> kMetadata = {"process_name", "thread_name",
                                                     "process_sort_index", "thread_sort_index"};
  // (ts, index, is_begin) of B/E events, per (pid, tid), for the pairing check.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::tuple<double, size_t, bool>>> stacks;

  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    if (!e.is_object()) {
      add(at(i) + "not an object");
      continue;
    }
    auto ph_it = e.find("ph");
    if (ph_it == e.end() || !ph_it->is_string()) {
      add(at(i) + "missing or non-string \"ph\"");
      continue;
    }
    const std::string ph = ph_it->get<std::string>();
    if (ph.size() != 1 || kPhases.find(ph) == std::string::npos) {
      add(at(i) + "unknown ph \"" + ph + "\"");
      continue;
    }
    const std::string where = at(i) + "(ph " + ph + ") ";
    bool ids_ok = true;
    for (const char* key : {"pid", "tid"}) {
      auto v = e.find(key);
      if (v == e.end() || !v->is_number_integer()) {
        add(where + "missing or non-integer \"" + key + "\"");
        ids_ok = false;
      }
    }
    auto name = e.find("name");
    if (ph != "E" && (name == e.end() || !name->is_string())) {
      add(where + "missing or non-string \"name\"");
    }
    auto ts = e.find("ts");
    const bool ts_ok = ts != e.end() && is_finite_number(*ts);
    if (ph != "M" && !ts_ok)
      add(where + "missing or non-numeric \"ts\"");
    auto args = e.find("args");

    if (ph == "X") {
      auto dur = e.find("dur");
      if (dur == e.end() || !is_finite_number(*dur))
        add(where + "missing or non-numeric \"dur\"");
      else if (dur->get<double>() < 0)
        add(where + "negative dur");
    } else if (ph == "C") {
      if (args == e.end() || !args->is_object() || args->empty()) {
        add(where + "counter without a non-empty args object");
      } else {
        for (auto a = args->begin(); a != args->end(); ++a) {
          if (!is_finite_number(a.value()))
            add(where + "counter arg \"" + a.key() + "\" is not a number");
        }
      }
    } else if (ph == "M" && name != e.end() && name->is_string()) {
      const std::string n = name->get<std::string>();
      if (std::find(kMetadata.begin(), kMetadata.end(), n) == kMetadata.end()) {
        add(where + "unknown metadata name \"" + n + "\"");
      } else if (args == e.end() || !args->is_object()) {
        add(where + "metadata without args");
      } else if (n == "process_name" || n == "thread_name") {
        auto v = args->find("name");
        if (v == args->end() || !v->is_string())
          add(where + n + " without a string args.name");
      } else {
        auto v = args->find("sort_index");
        if (v == args->end() || !v->is_number_integer()) {
          add(where + n + " without an integer args.sort_index");
        }
      }
    } else if ((ph == "B" || ph == "E") && ids_ok && ts_ok) {
      stacks[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}].emplace_back(ts->get<double>(), i,
                                                                              ph == "B");
    }
  }

  for (auto& [thread, list] : stacks) {
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
    const std::string where =
        "pid " + std::to_string(thread.first) + " tid " + std::to_string(thread.second) + ": ";
    std::vector<size_t> open;
    for (const auto& [ts, index, begin] : list) {
      if (begin)
        open.push_back(index);
      else if (open.empty())
        add(where + "E event traceEvents[" + std::to_string(index) + "] without a matching B");
      else
        open.pop_back();
    }
    for (size_t index : open) {
      add(where + "B event traceEvents[" + std::to_string(index) + "] never ended");
    }
  }
  return capped(std::move(problems));
}

} // namespace meshsim
