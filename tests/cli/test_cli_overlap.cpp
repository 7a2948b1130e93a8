// The overlap of DDP's bucket all-reduces with backward, as a run's trace.json shows it.
#include <gtest/gtest.h>

#include "cli_harness.h"

using namespace meshsim::testing;
using nlohmann::json;

namespace {

struct Span {
  double begin, end;  // µs
};

// Per GPU (the trace's pid): the spans of the complete events named `name`.
std::map<int64_t, std::vector<Span>> spans(const json& trace, const std::string& name) {
  std::map<int64_t, std::vector<Span>> out;
  for (const json& e : trace.at("traceEvents"))
    if (e.value("ph", "") == "X" && e.value("name", "") == name)
      out[e.at("pid").get<int64_t>()].push_back(
          {e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>()});
  return out;
}

// How many all-reduces of each GPU start while that GPU's backward runs.
std::map<int64_t, int> all_reduces_during_backward(const std::filesystem::path& run) {
  const json trace = read_json(run / "trace.json");
  const auto backward = spans(trace, "backward");
  std::map<int64_t, int> inside;
  for (const auto& [pid, reduces] : spans(trace, "all_reduce")) {
    inside[pid] = 0;
    for (const Span& x : reduces)
      for (const Span& b : backward.count(pid) ? backward.at(pid) : std::vector<Span>{})
        inside[pid] += b.begin < x.begin && x.begin < b.end;
  }
  return inside;
}

const std::string kDdpRun =
    kSmallTrain + "--strategy ddp --gpus 2 --batch-size 32 --max-steps 4 --bucket-mb 0.01 ";

} // namespace

TEST(CliOverlap, DdpTraceShowsBucketAllReducesStartingBeforeBackwardEnds) {
  const auto overlapped = fresh_dir("cli_overlap_on");
  auto r = run_meshsim(kDdpRun + "--out " + overlapped.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto inside = all_reduces_during_backward(overlapped);
  ASSERT_EQ(inside.size(), 2u);
  for (const auto& [pid, n] : inside)
    EXPECT_GT(n, 0) << "gpu " << pid << ": no all-reduce starts before its backward ends";

  // Without overlap none does, and the losses are the same.
  const auto serial = fresh_dir("cli_overlap_off");
  r = run_meshsim(kDdpRun + "--no-overlap --out " + serial.string());
  ASSERT_EQ(r.code, 0) << r.output;
  for (const auto& [pid, n] : all_reduces_during_backward(serial))
    EXPECT_EQ(n, 0) << "gpu " << pid;
  EXPECT_EQ(run_losses(overlapped), run_losses(serial));
}
