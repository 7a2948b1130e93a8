// The parts of a run made of processes. See run_parts.h.
#include "launch/run_parts.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "base/errors.h"
#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"
#include "cost/predict.h"
#include "base/atomic_file.h"
#include "base/json_integer.h"

namespace meshsim {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

fs::path part_path(const fs::path& run_dir, int rank) {
  return run_dir / "ranks" / fmt::format("rank-{}.json", rank);
}

json sample_json(const MemorySample& s) {
  json by_category = json::array();
  for (const CategoryBytes& b : s.by_category)
    by_category.push_back(std::vector<int64_t>(b.begin(), b.end()));
  return {{"time_s", s.time_s}, {"step", s.step},   {"phase", s.phase},
          {"rank", s.rank},     {"bytes", s.bytes}, {"by_category", by_category}};
}

// An integer a part holds, refused (never cast) when it is a float or past T: the parts are
// files in the run folder, which anyone can change between the ranks writing and rank 0 reading.
template <typename T> T whole(const json& v) {
  if (const std::optional<T> i = json_integer<T>(v)) return *i;
  throw std::runtime_error("an integer is a float or out of range: " + v.dump());
}

template <typename T> std::vector<T> wholes(const json& v) {
  std::vector<T> out;
  for (const json& x : v) out.push_back(whole<T>(x));
  return out;
}

MemorySample sample_from(const json& j) {
  MemorySample s;
  s.time_s = j.at("time_s").get<double>();
  s.step = whole<int64_t>(j.at("step"));
  s.phase = j.at("phase").get<std::string>();
  s.rank = whole<int>(j.at("rank"));
  s.bytes = wholes<int64_t>(j.at("bytes"));
  for (const json& b : j.at("by_category")) {
    const auto v = wholes<int64_t>(b);
    CategoryBytes c{};
    std::copy_n(v.begin(), std::min(v.size(), c.size()), c.begin());
    s.by_category.push_back(c);
  }
  return s;
}

json routing_json(const RoutingRecord& r) {
  return {{"step", r.step},   {"rank", r.rank},     {"layer", r.layer},
          {"first_expert", r.first_expert}, {"routed", r.routed}, {"ran", r.ran}};
}

// A record as a process wrote it: counts from 0 to 2^40 (so that sums over a run cannot
// overflow), the held experts within the routed ones.
RoutingRecord routing_from(const json& j) {
  RoutingRecord r;
  r.step = whole<int64_t>(j.at("step"));
  r.rank = whole<int>(j.at("rank"));
  r.layer = whole<int64_t>(j.at("layer"));
  r.first_expert = whole<int64_t>(j.at("first_expert"));
  r.routed = wholes<int64_t>(j.at("routed"));
  r.ran = wholes<int64_t>(j.at("ran"));
  constexpr int64_t kMost = int64_t{1} << 40;
  const auto counts = [&](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](int64_t n) { return n >= 0 && n <= kMost; });
  };
  if (r.routed.empty() || !counts(r.routed) || !counts(r.ran) || r.first_expert < 0 ||
      r.first_expert > static_cast<int64_t>(r.routed.size()) ||
      r.ran.size() > r.routed.size() - static_cast<size_t>(r.first_expert) || r.step < 0 ||
      r.step > kMost || r.layer < 0 || r.layer > kMost)
    throw std::runtime_error("a routing record is not one a run writes");
  return r;
}

} // namespace

void write_run_part(const fs::path& run_dir, const RunPart& part) {
  json samples = json::array();
  for (const MemorySample& s : part.samples)
    samples.push_back(sample_json(s));
  std::vector<Recorder> one{part.recorder};
  json routing = json::array();
  for (const RoutingRecord& r : part.routing)
    routing.push_back(routing_json(r));
  const json doc = {{"rank", part.rank},
                    {"clock_start_unix_s", part.clock_start_unix_s},
                    {"gpu", part.gpu},
                    {"capacity", part.capacity},
                    {"peak_by_category", std::vector<int64_t>(part.peak_by_category.begin(),
                                                              part.peak_by_category.end())},
                    {"records", records_to_json(one, 0)},
                    {"samples", samples},
                    {"routing", routing}};
  fs::create_directories(run_dir / "ranks");
  write_file_atomic(part_path(run_dir, part.rank), doc.dump() + "\n");
}

RunPart parse_run_part(const std::string& text, int rank, int world_size) {
  const json doc = parse_json(text, "its text");
  RunPart p;
  p.rank = whole<int>(doc.at("rank"));
  if (p.rank != rank)
    throw std::runtime_error(fmt::format("it holds rank {}", p.rank));
  p.clock_start_unix_s = doc.at("clock_start_unix_s").get<double>();
  p.gpu = doc.at("gpu");
  p.capacity = whole<int64_t>(doc.at("capacity"));
  const auto peaks = wholes<int64_t>(doc.at("peak_by_category"));
  std::copy_n(peaks.begin(), std::min(peaks.size(), p.peak_by_category.size()),
              p.peak_by_category.begin());
  const auto recorders = records_from_json(doc.at("records"), nullptr, world_size);
  if (recorders.size() != 1)
    throw std::runtime_error("its records are not one rank's");
  p.recorder = recorders.front();
  for (const json& s : doc.at("samples"))
    p.samples.push_back(sample_from(s));
  for (const json& record : doc.at("routing")) {
    p.routing.push_back(routing_from(record));
    if (p.routing.back().rank != rank)
      throw std::runtime_error("its routing is another rank's");
  }
  return p;
}

std::vector<RunPart> read_run_parts(const fs::path& run_dir, int world_size) {
  std::vector<RunPart> parts;
  for (int r = 0; r < world_size; ++r) {
    const fs::path path = part_path(run_dir, r);
    try {
      parts.push_back(parse_run_part(
          read_input_file(path.string(), "run part", kMaxRecordsBytes), r, world_size));
    } catch (const std::exception& e) {
      throw DataError(fmt::format("cannot read rank {}'s part {}: {}", r, printable(path.string()),
                                  e.what()));
    }
  }
  return parts;
}

MergedRun merge_run_parts(const std::vector<RunPart>& parts) {
  MergedRun out;
  const int n = static_cast<int>(parts.size());
  if (n == 0)
    return out;
  const double origin = parts.front().clock_start_unix_s;
  struct Row {
    double time_s;
    int part;
    const MemorySample* sample;
  };
  std::vector<Row> rows;
  for (int p = 0; p < n; ++p) {
    const double shift = parts[p].clock_start_unix_s - origin;
    Recorder r = parts[p].recorder;
    for (auto& c : r.compute)
      c.start_s += shift, c.end_s += shift;
    for (auto& c : r.collectives) {
      c.start_s += shift, c.end_s += shift;
      if (c.waited_s >= 0)
        c.waited_s += shift;
    }
    out.recorders.push_back(std::move(r));
    out.routing.insert(out.routing.end(), parts[p].routing.begin(), parts[p].routing.end());
    for (const MemorySample& s : parts[p].samples)
      rows.push_back({s.time_s + shift, p, &s});
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.time_s < b.time_s; });
  // Until its process's first row, a GPU holds what that row says (processes start their
  // clocks a few milliseconds apart; nothing is allocated in between).
  std::vector<int64_t> bytes(n, 0);
  std::vector<CategoryBytes> by_category(n, CategoryBytes{});
  for (const RunPart& part : parts) {
    const int gpu = part.rank;
    if (part.samples.empty() || gpu >= n)
      continue;
    const MemorySample& first = part.samples.front();
    if (gpu < static_cast<int>(first.bytes.size()))
      bytes[gpu] = first.bytes[gpu];
    if (gpu < static_cast<int>(first.by_category.size()))
      by_category[gpu] = first.by_category[gpu];
  }
  for (const Row& row : rows) {
    const MemorySample& s = *row.sample;
    const int gpu = parts[row.part].rank;
    if (gpu >= n)
      continue;
    if (gpu < static_cast<int>(s.bytes.size()))
      bytes[gpu] = s.bytes[gpu];
    if (gpu < static_cast<int>(s.by_category.size()))
      by_category[gpu] = s.by_category[gpu];
    MemorySample merged;
    merged.time_s = row.time_s;
    merged.step = s.step;
    merged.phase = s.phase;
    merged.rank = s.rank;
    merged.bytes = bytes;
    merged.by_category = by_category;
    out.samples.push_back(std::move(merged));
  }
  return out;
}

} // namespace meshsim
