// Tests for src/report/trace: the Chrome Trace Event Format timeline (trace.json) and its
// validator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "report/trace.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace meshsim;

namespace {

/// Two ranks: forward/backward/optimizer of step 3, an all_reduce, a send/recv pair.
std::vector<Recorder> two_ranks() {
  std::vector<Recorder> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].compute = {{"forward", 3, 0.001, 0.0025, 0, 0, "", {}},
                        {"backward", 3, 0.0025, 0.006, 0, 0, "", {}},
                        {"optimizer", 3, 0.007, 0.007, 0, 0, "", {}}}; // zero length
    ranks[r].collectives = {{"all_reduce", {0, 1}, 4096, 7, -1, 0.006, 0.0068}};
  }
  ranks[0].collectives.push_back({"send", {0, 1}, 512, 2, 1, 0.008, 0.0081});
  ranks[1].collectives.push_back({"recv", {0, 1}, 512, 2, 0, 0.008, 0.0083});
  return ranks;
}

std::vector<MemorySample> two_samples() {
  return {{0.0, 0, "start", {1 << 20, 2 << 20}}, {0.004, 3, "backward", {3 << 20, 512 << 10}}};
}

/// The events of `trace` with the given ph.
std::vector<json> events_with(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == ph)
      out.push_back(e);
  }
  return out;
}

/// A valid minimal trace to break in the validator tests.
json minimal_trace() {
  return {{"traceEvents",
           {{{"ph", "X"}, {"name", "a"}, {"pid", 0}, {"tid", 0}, {"ts", 1.0}, {"dur", 2.0}}}}};
}

bool mentions(const std::vector<std::string>& problems, const std::string& word) {
  for (const std::string& p : problems) {
    if (p.find(word) != std::string::npos)
      return true;
  }
  return false;
}

} // namespace

TEST(ReportTrace, TwoRankTraceValidates) {
  const json trace = chrome_trace(two_ranks(), two_samples(), "measured");
  EXPECT_EQ(validate_chrome_trace(trace), std::vector<std::string>{});
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  EXPECT_EQ(trace["otherData"]["label"], "measured");
  EXPECT_EQ(trace["otherData"]["num_gpus"], 2);
}

TEST(ReportTrace, OneProcessAndTwoThreadsPerGpu) {
  const json trace = chrome_trace(two_ranks(), {}, "measured");
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<int, int> sort_index;
  for (const json& m : events_with(trace, "M")) {
    const int pid = m["pid"];
    if (m["name"] == "process_name") {
      EXPECT_EQ(processes.count(pid), 0u) << "two process_name events for pid " << pid;
      processes[pid] = m["args"]["name"];
    } else if (m["name"] == "thread_name") {
      threads[{pid, m["tid"].get<int>()}] = m["args"]["name"];
    } else if (m["name"] == "process_sort_index") {
      sort_index[pid] = m["args"]["sort_index"];
    }
  }
  EXPECT_EQ(processes,
            (std::map<int, std::string>{{0, "gpu0 (measured)"}, {1, "gpu1 (measured)"}}));
  EXPECT_EQ(sort_index, (std::map<int, int>{{0, 0}, {1, 1}}));
  for (int pid = 0; pid < 2; ++pid) {
    EXPECT_EQ((threads[{pid, 0}]), "compute");
    EXPECT_EQ((threads[{pid, 1}]), "communication");
  }
}

TEST(ReportTrace, CompleteEventsInMicroseconds) {
  const json trace = chrome_trace(two_ranks(), {}, "measured");
  const std::vector<json> xs = events_with(trace, "X");
  ASSERT_EQ(xs.size(), 2u * 3 + 2 * 2);
  int checked = 0;
  for (const json& x : xs) {
    EXPECT_GE(x["ts"].get<double>(), 0);
    EXPECT_GE(x["dur"].get<double>(), 0);
    if (x["pid"] == 0 && x["name"] == "backward") {
      EXPECT_EQ(x["cat"], "compute");
      EXPECT_EQ(x["tid"], 0);
      EXPECT_NEAR(x["ts"].get<double>(), 2500.0, 1e-6);
      EXPECT_NEAR(x["dur"].get<double>(), 3500.0, 1e-6);
      EXPECT_EQ(x["args"]["step"], 3);
      ++checked;
    } else if (x["pid"] == 1 && x["name"] == "optimizer") {
      EXPECT_EQ(x["dur"].get<double>(), 0.0);
      ++checked;
    } else if (x["pid"] == 1 && x["name"] == "all_reduce") {
      EXPECT_EQ(x["cat"], "comm");
      EXPECT_EQ(x["tid"], 1);
      EXPECT_NEAR(x["ts"].get<double>(), 6000.0, 1e-6);
      EXPECT_NEAR(x["dur"].get<double>(), 800.0, 1e-6);
      EXPECT_EQ(x["args"], (json{{"bytes", 4096}, {"group", "0,1"}, {"seq", 7}, {"peer", -1}}));
      ++checked;
    } else if (x["pid"] == 1 && x["name"] == "recv") {
      EXPECT_EQ(x["args"]["peer"], 0);
      EXPECT_NEAR(x["dur"].get<double>(), 300.0, 1e-6);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
}

TEST(ReportTrace, NegativeTimesAreClamped) {
  std::vector<Recorder> ranks(1);
  ranks[0].compute = {{"forward", 0, 0.002, 0.001, 0, 0, "", {}}}; // end before start
  ranks[0].collectives = {{"barrier", {0}, 0, 0, -1, -0.5, 0.001}};
  const json trace = chrome_trace(ranks, {}, "measured");
  EXPECT_TRUE(validate_chrome_trace(trace).empty());
  for (const json& x : events_with(trace, "X")) {
    EXPECT_GE(x["ts"].get<double>(), 0);
    EXPECT_GE(x["dur"].get<double>(), 0);
  }
}

TEST(ReportTrace, MemoryCounters) {
  const json trace = chrome_trace(two_ranks(), two_samples(), "measured");
  const std::vector<json> cs = events_with(trace, "C");
  ASSERT_EQ(cs.size(), 4u); // 2 samples x 2 GPUs
  std::map<std::pair<int, double>, double> mib;
  for (const json& c : cs) {
    EXPECT_EQ(c["name"], "memory (MiB)");
    const int pid = c["pid"];
    mib[{pid, c["ts"].get<double>()}] = c["args"]["gpu" + std::to_string(pid)];
  }
  EXPECT_DOUBLE_EQ((mib[{0, 0.0}]), 1.0);
  EXPECT_DOUBLE_EQ((mib[{1, 0.0}]), 2.0);
  EXPECT_DOUBLE_EQ((mib[{0, 4000.0}]), 3.0);
  EXPECT_DOUBLE_EQ((mib[{1, 4000.0}]), 0.5);
}

TEST(ReportTrace, MemorySampleOfWrongWidthThrows) {
  std::vector<MemorySample> bad = {{0.0, 0, "start", {1}}};
  EXPECT_THROW(chrome_trace(two_ranks(), bad, "measured"), std::invalid_argument);
  EXPECT_THROW(chrome_trace(two_ranks(), {}, "measured", -1), std::invalid_argument);
}

TEST(ReportTrace, PidOffsetKeepsTwoTimelinesApart) {
  const json measured = chrome_trace(two_ranks(), two_samples(), "measured");
  const json predicted = chrome_trace(two_ranks(), two_samples(), "predicted", 2);
  json merged = measured;
  for (const json& e : predicted["traceEvents"])
    merged["traceEvents"].push_back(e);
  EXPECT_TRUE(validate_chrome_trace(merged).empty());
  std::set<std::string> names;
  std::set<int> pids;
  for (const json& e : predicted["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e["name"] == "process_name")
      names.insert(e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(pids, (std::set<int>{2, 3}));
  EXPECT_EQ(names, (std::set<std::string>{"gpu0 (predicted)", "gpu1 (predicted)"}));
  EXPECT_EQ(predicted["otherData"]["pid_offset"], 2);
  for (const json& c : events_with(predicted, "C")) {
    // The counter arg still names the GPU, not the pid.
    EXPECT_TRUE(c["args"].contains("gpu" + std::to_string(c["pid"].get<int>() - 2)));
  }
}

TEST(ReportTrace, WriteAndParseBack) {
  const fs::path path =
      fs::temp_directory_path() / ("meshsim-trace-test-" + std::to_string(::getpid()) + ".json");
  const json trace = chrome_trace(two_ranks(), two_samples(), "measured");
  write_chrome_trace(path, trace);
  std::ifstream in(path);
  const json back = json::parse(in);
  EXPECT_EQ(back, trace);
  EXPECT_TRUE(validate_chrome_trace(back).empty());
  fs::remove(path);
}

TEST(ReportTrace, ValidatorAcceptsGoodTraces) {
  EXPECT_TRUE(validate_chrome_trace(minimal_trace()).empty());
  EXPECT_TRUE(validate_chrome_trace(minimal_trace()["traceEvents"]).empty()); // array form
  json nested = minimal_trace();
  for (auto [ph, ts] : {std::pair{"B", 1}, {"B", 2}, {"E", 3}, {"E", 4}}) {
    nested["traceEvents"].push_back(
        {{"ph", ph}, {"name", "n"}, {"pid", 5}, {"tid", 2}, {"ts", ts}});
  }
  EXPECT_TRUE(validate_chrome_trace(nested).empty());
}

TEST(ReportTrace, ValidatorRejectsBrokenTraces) {
  EXPECT_FALSE(validate_chrome_trace(json::object()).empty());
  EXPECT_FALSE(validate_chrome_trace(json{{"traceEvents", 3}}).empty());

  json no_ph = minimal_trace();
  no_ph["traceEvents"][0].erase("ph");
  EXPECT_TRUE(mentions(validate_chrome_trace(no_ph), "ph"));

  json bad_ph = minimal_trace();
  bad_ph["traceEvents"][0]["ph"] = "Q";
  EXPECT_TRUE(mentions(validate_chrome_trace(bad_ph), "unknown ph"));

  json negative = minimal_trace();
  negative["traceEvents"][0]["dur"] = -1.0;
  EXPECT_TRUE(mentions(validate_chrome_trace(negative), "negative dur"));

  json string_pid = minimal_trace();
  string_pid["traceEvents"][0]["pid"] = "0";
  EXPECT_TRUE(mentions(validate_chrome_trace(string_pid), "pid"));

  json counter = minimal_trace();
  counter["traceEvents"].push_back(
      {{"ph", "C"}, {"name", "m"}, {"pid", 0}, {"tid", 0}, {"ts", 0}, {"args", {{"gpu0", "big"}}}});
  EXPECT_TRUE(mentions(validate_chrome_trace(counter), "not a number"));

  json meta = minimal_trace();
  meta["traceEvents"].push_back(
      {{"ph", "M"}, {"name", "colour"}, {"pid", 0}, {"tid", 0}, {"args", json::object()}});
  meta["traceEvents"].push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"tid", 0}});
  EXPECT_EQ(validate_chrome_trace(meta).size(), 2u);
}

TEST(ReportTrace, ValidatorRejectsUnbalancedBeginEnd) {
  json open = minimal_trace();
  open["traceEvents"].push_back({{"ph", "B"}, {"name", "n"}, {"pid", 0}, {"tid", 0}, {"ts", 5}});
  EXPECT_TRUE(mentions(validate_chrome_trace(open), "never ended"));

  json stray = minimal_trace();
  stray["traceEvents"].push_back({{"ph", "E"}, {"pid", 0}, {"tid", 0}, {"ts", 5}});
  EXPECT_TRUE(mentions(validate_chrome_trace(stray), "without a matching B"));

  // Balanced in count but on different threads, and an E before its B in time.
  json split = minimal_trace();
  split["traceEvents"].push_back({{"ph", "B"}, {"name", "n"}, {"pid", 0}, {"tid", 0}, {"ts", 5}});
  split["traceEvents"].push_back({{"ph", "E"}, {"pid", 0}, {"tid", 1}, {"ts", 6}});
  EXPECT_EQ(validate_chrome_trace(split).size(), 2u);
  json early = minimal_trace();
  early["traceEvents"].push_back({{"ph", "B"}, {"name", "n"}, {"pid", 0}, {"tid", 0}, {"ts", 9}});
  early["traceEvents"].push_back({{"ph", "E"}, {"pid", 0}, {"tid", 0}, {"ts", 4}});
  EXPECT_EQ(validate_chrome_trace(early).size(), 2u);
}

TEST(ReportTrace, ValidatorCapsItsReport) {
  json many = json{{"traceEvents", json::array()}};
  for (int i = 0; i < 200; ++i)
    many["traceEvents"].push_back({{"pid", 0}});
  const std::vector<std::string> problems = validate_chrome_trace(many);
  ASSERT_EQ(problems.size(), 50u);
  EXPECT_EQ(problems.back(), "... and 151 more problems");
}
