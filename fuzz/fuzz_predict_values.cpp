// Fuzzes `meshsim predict` on records.json's *values*: a well-formed records document of a
// small DDP run (two ranks, two steps, layers and bucketed all-reduces) whose every number the
// input may replace (0, -1, negated, 1e308, the int64 limits, a scaled or an arbitrary value).
// A value that is not finite becomes null, as JSON text holds it; then records_from_json, an optional data-parallel resize (as --gpus does) and predict. Each must
// accept or refuse in one line (DataError, std::invalid_argument); an accepted prediction must
// have every figure finite and non-negative and an MFU of at most 100%. Anything else escaping,
// a crash or undefined behaviour is a bug.
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "base/errors.h"
#include "cost/hardware.h"
#include "cost/predict.h"
#include "fuzz_common.h"

namespace {

using nlohmann::json;

json layer(const char* name, const char* op, double flops, double bytes, int64_t params) {
  return json::array({name, op, flops, bytes, params, 3, 1, flops * 0.9, bytes * 0.5, 0.0});
}

json rank_records(int rank) {
  json compute = json::array(), collectives = json::array();
  int64_t seq = 0;
  for (int step = 1; step <= 2; ++step) {
    const double t = 0.1 * step;
    compute.push_back({{"name", "forward"}, {"step", step}, {"start_s", t}, {"end_s", t + 0.01},
                       {"start_charges", 10 * step}, {"end_charges", 10 * step + 4},
                       {"flops", 2e9}, {"recompute_flops", 0.0}, {"bytes", 1e6}, {"op", "forward"},
                       {"layers", {layer("fc1", "linear", 1e9, 5e5, 4096), layer("fc2", "linear", 1e9, 5e5, 4096)}}});
    compute.push_back({{"name", "backward"}, {"step", step}, {"start_s", t + 0.01}, {"end_s", t + 0.03},
                       {"start_charges", 10 * step + 4}, {"end_charges", 10 * step + 8},
                       {"flops", 4e9}, {"recompute_flops", 0.0}, {"bytes", 2e6}, {"op", "backward"},
                       {"layers", {layer("fc2", "linear", 2e9, 1e6, 4096), layer("fc1", "linear", 2e9, 1e6, 4096)}}});
    for (int bucket = 0; bucket < 2; ++bucket)
      collectives.push_back({{"op", "all_reduce"}, {"group", {0, 1}}, {"bytes", 4096},
                             {"seq", seq++}, {"peer", -1}, {"start_s", t + 0.02 + 0.005 * bucket},
                             {"end_s", t + 0.031 + 0.001 * bucket}, {"start_charges", -1},
                             {"end_charges", -1}, {"waited_s", t + 0.031}});
    compute.push_back({{"name", "optimizer"}, {"step", step}, {"start_s", t + 0.035}, {"end_s", t + 0.04},
                       {"flops", 1e5}, {"bytes", 1e5}, {"op", "optimizer"}, {"layers", json::array()}});
  }
  (void)rank;
  return {{"compute", compute}, {"collectives", collectives}};
}

const json& base_records() {
  static const json doc = {{"format", "meshsim-records-1"},
                           {"samples_per_step", 64},
                           {"ranks", {rank_records(0), rank_records(1)}}};
  return doc;
}

// Reads the input a byte (or eight) at a time; zeros once it runs out.
struct Input {
  const uint8_t* data;
  size_t size;
  uint8_t byte() { return size ? (--size, *data++) : 0; }
  uint64_t u64() {
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = bits << 8 | byte();
    return bits;
  }
  double f64() {
    const uint64_t bits = u64();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

json mutated(const json& v, Input& in) {
  if (v.is_object() || v.is_array()) {
    json out = v;
    for (auto& child : out) child = mutated(child, in);
    return out;
  }
  if (!v.is_number()) return v;
  const double x = v.get<double>();
  // JSON text has no NaN or infinity: a file holds null there.
  const auto finite = [](double d) { return std::isfinite(d) ? json(d) : json(nullptr); };
  switch (in.byte() % 12) {
  case 0: return 0;
  case 1: return -1;
  case 2: return v.is_number_integer() ? json(-v.get<int64_t>()) : finite(-x);
  case 3: return 1e308;
  case 4: return std::numeric_limits<int64_t>::max();
  case 5: return std::numeric_limits<int64_t>::min();
  case 6: return finite(x * 1e6);
  case 7: return finite(x * 1e-6);
  case 8: return finite(in.f64());
  case 9: return v.is_number_integer() ? json(static_cast<int64_t>(in.u64())) : finite(in.f64());
  default: return v; // most values stay as recorded
  }
}

void fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  const uint8_t gpus = in.byte();
  const json doc = mutated(base_records(), in);
  try {
    int64_t samples_per_step = 0;
    std::vector<meshsim::Recorder> ranks = meshsim::records_from_json(doc, &samples_per_step);
    if (gpus % 4 == 1) { // --gpus N on a data-parallel run
      const int n = 1 + gpus / 4 % 16;
      samples_per_step = samples_per_step / static_cast<int64_t>(ranks.size()) * n;
      ranks = meshsim::resize_data_parallel(ranks, n);
    }
    const meshsim::Prediction p =
        meshsim::predict(ranks, samples_per_step, meshsim::parse_cluster_spec("2x8xh100"));
    meshsim::check_prediction(p);
    for (const double v : {p.step_time_s, p.samples_per_s, p.tflops_per_gpu, p.mfu, p.exposed_comm_s})
      if (!std::isfinite(v) || v < 0) fail("an accepted prediction has a figure that is not finite and non-negative");
    if (p.mfu > 1 + 1e-9) fail("an accepted prediction has an MFU above 100%");
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
