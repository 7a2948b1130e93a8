// predict(): replay one step and derive the headline numbers; the records' JSON form, which
// lets `meshsim predict` redo this from a run folder with bit-identical inputs.
#include "cost/predict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>

#include "base/errors.h"
#include "base/printable.h"
#include "base/json_integer.h"

namespace meshsim {
namespace {

using nlohmann::json;

// The task's name as the recorder spelled it: ids are "r<rank>/<index>:<name>".
std::string task_name(const std::string& id) {
  const auto colon = id.find(':');
  return colon == std::string::npos ? id : id.substr(colon + 1);
}

std::vector<Recorder> timeline_of(const Program& program, const ReplayResult& result,
                                  int64_t step) {
  std::vector<Recorder> out(program.ranks.size());
  size_t t = 0;
  for (size_t r = 0; r < program.ranks.size(); ++r)
    for (const Task& task : program.ranks[r]) {
      const TaskTiming& timing = result.tasks[t++];
      if (task.kind == TaskKind::Compute) {
        ComputeRecord c;
        c.name = task_name(task.id);
        c.step = step;
        c.start_s = timing.start_s;
        c.end_s = timing.end_s;
        out[r].compute.push_back(c);
        continue;
      }
      CollectiveRecord c;
      c.op = task_name(task.id);
      c.group = task.group;
      c.bytes = static_cast<int64_t>(task.bytes);
      for (double b : task.peer_bytes)
        c.peer_bytes.push_back(static_cast<int64_t>(b));
      if (task.op == CollectiveOp::SendRecv)
        c.peer = task.group[0] == static_cast<int>(r) ? task.group[1] : task.group[0];
      c.start_s = timing.start_s;
      c.end_s = timing.end_s;
      out[r].collectives.push_back(c);
    }
  return out;
}

// An integer that fits T: a float or a number past T is refused, never cast.
template <typename T> T integer(const json& v, const char* name) {
  if (const std::optional<T> i = json_integer<T>(v)) return *i;
  throw DataError(std::string("records.json: \"") + name +
                              "\" is not an integer from " +
                              std::to_string(std::numeric_limits<T>::min()) + " to " +
                              std::to_string(std::numeric_limits<T>::max()));
}

// A field older records lack: `absent` when missing, else an integer that fits T (a float such
// as 1e308 is refused, never cast).
template <typename T> T optional_integer(const json& j, const char* name, T absent) {
  const auto it = j.find(name);
  return it == j.end() ? absent : integer<T>(*it, name);
}

template <typename T> T field(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end())
    throw DataError(std::string("records.json: missing \"") + name + "\"");
  if constexpr (std::is_integral_v<T>) {
    return integer<T>(*it, name);
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    if (!it->is_array())
      throw DataError(std::string("records.json: \"") + name + "\" is not an array");
    T out;
    for (const json& v : *it)
      out.push_back(integer<int>(v, name));
    return out;
  } else {
    return it->get<T>();
  }
}

} // namespace

Prediction predict(const std::vector<Recorder>& ranks, int64_t samples_per_step,
                   const ClusterSpec& cluster, const PredictOptions& given) {
  PredictOptions options = given;
  options.efficiency = given.efficiency.on(cluster.gpu); // Hopper's GEMM efficiency on Hopper
  Prediction p;
  p.cluster = cluster.to_string();
  p.world_size = static_cast<int>(ranks.size());
  p.samples_per_step = samples_per_step;
  p.step = options.step >= 0 ? options.step : representative_step(ranks);
  if (options.step >= 0) {
    // A step the run never recorded would replay nothing and predict a step of no time.
    int64_t first = INT64_MAX, last = 0;
    bool recorded = false;
    for (const Recorder& r : ranks)
      for (const ComputeRecord& c : r.compute)
        if (c.step > 0) {
          first = std::min(first, c.step), last = std::max(last, c.step);
          recorded = recorded || c.step == options.step;
        }
    if (!recorded)
      throw std::invalid_argument(
          last == 0 ? fmt::format("--step {}: the run recorded no training step", options.step)
                    : fmt::format("--step {}: the run recorded steps {} to {}", options.step,
                                  first, last));
  }
  p.dtype = to_string(options.dtype);
  p.compute_source = options.measured_compute ? "measured" : "roofline";
  double flops = 0, recomputed = 0;
  p.program = build_step_program(ranks, p.step, cluster.gpu, options, &flops, &recomputed);
  ReplayOptions replay_options;
  replay_options.efficiency = options.efficiency;
  replay_options.algorithm = options.algorithm;
  replay_options.absent_ranks_are_images = options.images;
  if (options.images) {
    const auto recorded = std::count_if(ranks.begin(), ranks.end(), [](const Recorder& r) {
      return !r.compute.empty() || !r.collectives.empty();
    });
    const double scale =
        recorded > 0 ? static_cast<double>(ranks.size()) / static_cast<double>(recorded) : 1.0;
    flops *= scale;
    recomputed *= scale;
  }
  p.flops = flops;
  p.model_flops = flops - recomputed;
  p.replay = replay(p.program, cluster, replay_options);
  p.exposed_comm_s = p.replay.max_exposed_comm_s();
  p.bubble_fraction = p.replay.bubble_fraction;
  double overlapped = 0; // communication hidden behind compute, on the rank with the most
  for (const RankStats& s : p.replay.ranks) {
    p.compute_s = std::max(p.compute_s, s.compute_busy_s);
    p.comm_s = std::max(p.comm_s, s.comm_busy_s);
    overlapped = std::max(overlapped, s.comm_busy_s - s.exposed_comm_s);
  }
  // Hidden is not free: the compute beside a collective runs slower (roofline.h).
  p.overlap_penalty_s = options.efficiency.overlap_slowdown * std::max(0.0, overlapped);
  p.step_time_s = p.replay.makespan_s + p.overlap_penalty_s;
  if (p.step_time_s > 0 && p.world_size > 0) {
    p.samples_per_s = static_cast<double>(samples_per_step) / p.step_time_s;
    p.tflops_per_gpu = flops / p.world_size / p.step_time_s / 1e12;
    p.mfu = p.model_flops / p.world_size / p.step_time_s / cluster.gpu.peak_flops(options.dtype);
  }
  p.timeline = timeline_of(p.program, p.replay, p.step);
  return p;
}

std::vector<Recorder> resize_data_parallel(const std::vector<Recorder>& ranks, int world) {
  if (ranks.empty() || world < 1)
    throw std::invalid_argument("resize_data_parallel: nothing to resize");
  std::vector<int> recorded_world;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    recorded_world.push_back(r);
  std::vector<int> new_world;
  for (int r = 0; r < world; ++r)
    new_world.push_back(r);
  Recorder model = ranks[0];
  for (CollectiveRecord& c : model.collectives) {
    if (c.group != recorded_world || c.op == "send" || c.op == "recv")
      throw std::invalid_argument("only runs whose collectives all span every GPU "
                                  "(data parallel) can be replayed on another GPU count");
    c.group = new_world;
  }
  return std::vector<Recorder>(static_cast<size_t>(world), model);
}

json to_json(const Prediction& p) {
  return {{"cluster", p.cluster},
          {"step", p.step},
          {"world_size", p.world_size},
          {"samples_per_step", p.samples_per_step},
          {"dtype", p.dtype},
          {"compute", p.compute_source},
          {"step_time_s", p.step_time_s},
          {"samples_per_s", p.samples_per_s},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"mfu", p.mfu},
          {"exposed_comm_s", p.exposed_comm_s},
          {"bubble_fraction", p.bubble_fraction},
          {"overlap_penalty_s", p.overlap_penalty_s},
          {"compute_s", p.compute_s},
          {"comm_s", p.comm_s}};
}

json records_to_json(const std::vector<Recorder>& ranks, int64_t samples_per_step) {
  json out_ranks = json::array();
  for (const Recorder& r : ranks) {
    json compute = json::array(), collectives = json::array();
    for (const ComputeRecord& c : r.compute) {
      json layers = json::array();
      for (const LayerWork& w : c.layers)
        layers.push_back(
            {w.layer, w.op, w.flops, w.bytes, w.param_bytes, w.kernels, w.gemms, w.gemm_flops,
             w.gemm_bytes, w.score_bytes});
      compute.push_back({{"name", c.name},
                         {"step", c.step},
                         {"start_s", c.start_s},
                         {"end_s", c.end_s},
                         {"start_charges", c.start_charges},
                         {"end_charges", c.end_charges},
                         {"flops", c.flops},
                         {"recompute_flops", c.recompute_flops},
                         {"bytes", c.bytes},
                         {"op", c.op},
                         {"layers", layers}});
    }
    for (const CollectiveRecord& c : r.collectives) {
      json rec = {{"op", c.op},
                  {"group", c.group},
                  {"bytes", c.bytes},
                  {"seq", c.seq},
                  {"peer", c.peer},
                  {"start_s", c.start_s},
                  {"end_s", c.end_s},
                  {"start_charges", c.start_charges},
                  {"end_charges", c.end_charges}};
      if (c.waited_s >= 0)
        rec["waited_s"] = c.waited_s;
      if (!c.peer_bytes.empty())
        rec["peer_bytes"] = c.peer_bytes;
      collectives.push_back(std::move(rec));
    }
    out_ranks.push_back({{"compute", compute}, {"collectives", collectives}});
  }
  return {{"format", "meshsim-records-1"},
          {"samples_per_step", samples_per_step},
          {"ranks", out_ranks}};
}

namespace {

// What a run can have recorded. Each limit is far past any real run, and keeps the replay's
// arithmetic finite: a value outside one is a damaged or hand-made records.json.
constexpr double kMaxRecordedSeconds = 1e9;   // 31 years
constexpr double kMaxRecordedWork = 1e30;     // FLOPs or bytes of one region
constexpr int64_t kMaxRecordedSamples = int64_t{1} << 40;

[[noreturn]] void impossible(const std::string& where, const std::string& why) {
  throw DataError(fmt::format("records.json: {} {}", where, why));
}

void check_amount(double v, double max, const std::string& where) {
  if (!std::isfinite(v) || v < 0 || v > max)
    impossible(where, fmt::format("is {}, not a number from 0 to {:g}", v, max));
}

// Times are seconds on the run's clock; merged processes' clocks may start a little before it.
void check_span(double start, double end, const std::string& where) {
  for (const auto& [name, t] : {std::pair<const char*, double>{".start_s", start}, {".end_s", end}})
    if (!std::isfinite(t) || std::fabs(t) > kMaxRecordedSeconds)
      impossible(where + name, fmt::format("is {}, not a time within {:g} s", t, kMaxRecordedSeconds));
  if (end < start) impossible(where, fmt::format("ends ({} s) before it starts ({} s)", end, start));
}

void check_records(const std::vector<Recorder>& ranks, int64_t samples_per_step, int world) {
  if (samples_per_step < 1 || samples_per_step > kMaxRecordedSamples)
    impossible("\"samples_per_step\"", fmt::format("is {}, not 1 to {}", samples_per_step,
                                                     kMaxRecordedSamples));
  if (ranks.empty()) impossible("\"ranks\"", "is empty");
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t i = 0; i < ranks[r].compute.size(); ++i) {
      const ComputeRecord& c = ranks[r].compute[i];
      const std::string at = fmt::format("rank {} compute[{}]", r, i);
      if (c.step < 0) impossible(at, fmt::format("has step {}", c.step));
      check_span(c.start_s, c.end_s, at);
      check_amount(c.flops, kMaxRecordedWork, at + ".flops");
      check_amount(c.recompute_flops, kMaxRecordedWork, at + ".recompute_flops");
      check_amount(c.bytes, kMaxRecordedWork, at + ".bytes");
      if (c.recompute_flops > c.flops)
        impossible(at, fmt::format("recomputes {:g} FLOPs of its {:g}", c.recompute_flops, c.flops));
      for (const LayerWork& w : c.layers) {
        for (const double v : {w.flops, w.bytes, w.gemm_flops, w.gemm_bytes, w.score_bytes})
          check_amount(v, kMaxRecordedWork, at + " layer " + printable(w.layer));
        if (w.param_bytes < 0 || w.kernels < 0 || w.gemms < 0)
          impossible(at + " layer " + printable(w.layer), "has a negative count");
      }
    }
    for (size_t i = 0; i < ranks[r].collectives.size(); ++i) {
      const CollectiveRecord& c = ranks[r].collectives[i];
      const std::string at = fmt::format("rank {} collectives[{}]", r, i);
      check_span(c.start_s, c.end_s, at);
      if (c.bytes < 0) impossible(at, fmt::format("moves {} bytes", c.bytes));
      if (c.seq < 0) impossible(at, fmt::format("has seq {}", c.seq));
      if (c.group.empty()) impossible(at, "has an empty group");
      for (const int g : c.group)
        if (g < 0 || g >= world) impossible(at, fmt::format("names rank {} of {}", g, world));
      if (c.peer < -1 || c.peer >= world) impossible(at, fmt::format("names peer {} of {}", c.peer, world));
      if (!c.peer_bytes.empty() && c.peer_bytes.size() != c.group.size())
        impossible(at, fmt::format("has {} peer byte counts for a group of {}",
                                   c.peer_bytes.size(), c.group.size()));
      for (const int64_t b : c.peer_bytes)
        if (b < 0) impossible(at, fmt::format("sends a peer {} bytes", b));
      if (c.waited_s != -1.0 && !(std::isfinite(c.waited_s) &&
                                  std::fabs(c.waited_s) <= kMaxRecordedSeconds))
        impossible(at, fmt::format("was waited for at {} s", c.waited_s));
    }
  }
}

} // namespace

void check_prediction(const Prediction& p) {
  for (const auto& [name, v] : {std::pair<const char*, double>{"step time", p.step_time_s},
                                {"samples/s", p.samples_per_s},
                                {"TFLOP/s per GPU", p.tflops_per_gpu},
                                {"MFU", p.mfu},
                                {"exposed communication", p.exposed_comm_s}})
    if (!std::isfinite(v) || v < 0)
      throw DataError(fmt::format("records.json: the recorded work predicts a {} of {}: the "
                                  "records are damaged or made by hand",
                                  name, v));
  // The model's FLOPs in the predicted time, over the GPUs' peak: above 1 only when the records
  // claim more work than their regions take.
  if (p.mfu > 1 + 1e-9)
    throw DataError(fmt::format("records.json: the recorded work predicts an MFU of {:.0f}%, more "
                                "than the GPU's peak: the records are damaged or made by hand",
                                100 * p.mfu));
}

std::vector<Recorder> records_from_json(const json& doc, int64_t* samples_per_step, int world) {
  try {
    if (field<std::string>(doc, "format") != "meshsim-records-1")
      throw DataError("records.json: unknown format");
    if (samples_per_step)
      *samples_per_step = field<int64_t>(doc, "samples_per_step");
    std::vector<Recorder> ranks;
    for (const json& jr : field<json>(doc, "ranks")) {
      Recorder r;
      for (const json& j : field<json>(jr, "compute")) {
        ComputeRecord c;
        c.name = field<std::string>(j, "name");
        c.step = field<int64_t>(j, "step");
        c.start_s = field<double>(j, "start_s");
        c.end_s = field<double>(j, "end_s");
        c.start_charges = optional_integer<int64_t>(j, "start_charges", -1); // absent in older records
        c.end_charges = optional_integer<int64_t>(j, "end_charges", -1);
        c.flops = field<double>(j, "flops");
        c.recompute_flops = j.value("recompute_flops", 0.0); // absent in records before it
        c.bytes = field<double>(j, "bytes");
        c.op = field<std::string>(j, "op");
        for (const json& w : field<json>(j, "layers")) {
          LayerWork layer{w.at(0).get<std::string>(), w.at(1).get<std::string>(),
                          w.at(2).get<double>(), w.at(3).get<double>(),
                          integer<int64_t>(w.at(4), "layers")};
          if (w.size() >= 10) { // absent in records before kernels were counted
            layer.kernels = integer<int64_t>(w.at(5), "layers");
            layer.gemms = integer<int64_t>(w.at(6), "layers");
            layer.gemm_flops = w.at(7).get<double>();
            layer.gemm_bytes = w.at(8).get<double>();
            layer.score_bytes = w.at(9).get<double>();
          }
          c.layers.push_back(std::move(layer));
        }
        r.compute.push_back(std::move(c));
      }
      for (const json& j : field<json>(jr, "collectives")) {
        CollectiveRecord c;
        c.op = field<std::string>(j, "op");
        c.group = field<std::vector<int>>(j, "group");
        c.bytes = field<int64_t>(j, "bytes");
        c.seq = field<int64_t>(j, "seq");
        c.peer = field<int>(j, "peer");
        c.start_s = field<double>(j, "start_s");
        c.end_s = field<double>(j, "end_s");
        c.start_charges = optional_integer<int64_t>(j, "start_charges", -1);
        c.end_charges = optional_integer<int64_t>(j, "end_charges", -1);
        c.waited_s = j.value("waited_s", -1.0); // absent for blocking calls
        if (const auto pb = j.find("peer_bytes"); pb != j.end()) { // all_to_all only
          if (!pb->is_array())
            throw DataError("records.json: \"peer_bytes\" is not a list");
          for (const json& b : *pb)
            c.peer_bytes.push_back(integer<int64_t>(b, "peer_bytes"));
        }
        r.collectives.push_back(std::move(c));
      }
      ranks.push_back(std::move(r));
    }
    check_records(ranks, samples_per_step ? *samples_per_step : 1,
                  world > 0 ? world : static_cast<int>(ranks.size()));
    return ranks;
  } catch (const json::exception& e) {
    throw DataError(std::string("records.json: malformed: ") + printable(e.what()));
  }
}

} // namespace meshsim
