// The prediction wired into real runs: `meshsim train --cluster` writes a valid trace.json
// with measured and predicted timelines and summary["prediction"]; `meshsim predict` on the
// run folder gives the same numbers; the recorded DDP run scales on NVLink and a large
// model scales worse over PCIe 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "../cli/cli_harness.h"
#include "models/layers/flops.h"
#include "cost/predict.h"
#include "report/trace.h"

namespace meshsim {
namespace {

using testing::fresh_dir;
using testing::read_json;

// One small DDP run shared by the tests of this file (2 GPUs, 3 steps of 64 per GPU).
const std::filesystem::path& ddp_run() {
  static const std::filesystem::path dir = [] {
    auto d = fresh_dir("predict-ddp");
    const auto r = testing::run_meshsim(
        "train --gpus 2 --strategy ddp --data synthetic --synthetic-train 512 --synthetic-test 64 "
        "--max-steps 3 --batch-size 64 --cluster 8xa100-80 --out " +
        d.string());
    EXPECT_EQ(r.code, 0) << r.output;
    return d;
  }();
  return dir;
}

std::string run_stdout(const std::string& args) {
  std::string out;
  FILE* pipe = popen((std::string(MESHSIM_BINARY) + " " + args + " 2>/dev/null").c_str(), "r");
  if (!pipe)
    return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0)
    out.append(buf, n);
  pclose(pipe);
  return out;
}

TEST(CostPredictRun, TrainWritesAValidTraceWithBothTimelines) {
  const nlohmann::json trace = read_json(ddp_run() / "trace.json");
  const auto problems = validate_chrome_trace(trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
  std::set<std::string> processes;
  std::set<std::pair<int, std::string>> events; // (pid, cat)
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name")
      processes.insert(e["args"]["name"]);
    if (e["ph"] == "X")
      events.insert({e["pid"].get<int>(), e["cat"].get<std::string>()});
  }
  ASSERT_EQ(processes.size(), 4u); // one per GPU, measured and predicted
  EXPECT_TRUE(processes.count("gpu0 (measured)"));
  EXPECT_TRUE(std::any_of(processes.begin(), processes.end(), [](const std::string& p) {
    return p.rfind("gpu1 (predicted 1x8xa100-80", 0) == 0;
  })) << *processes.rbegin();
  for (int pid = 0; pid < 4; ++pid) {
    EXPECT_TRUE(events.count({pid, "compute"})) << pid;
    EXPECT_TRUE(events.count({pid, "comm"})) << pid;
  }
}

TEST(CostPredictRun, WithoutClusterTheTraceHoldsTheMeasuredTimelineOnly) {
  const auto dir = fresh_dir("predict-none");
  const auto r = testing::run_meshsim(
      "train --gpus 2 --strategy ddp --data synthetic --synthetic-train 128 --synthetic-test 32 "
      "--max-steps 2 --batch-size 16 --out " +
      dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json trace = read_json(dir / "trace.json");
  EXPECT_TRUE(validate_chrome_trace(trace).empty());
  int processes = 0;
  for (const auto& e : trace["traceEvents"])
    processes += e["ph"] == "M" && e["name"] == "process_name";
  EXPECT_EQ(processes, 2);
  EXPECT_FALSE(read_json(dir / "summary.json").contains("prediction"));
  EXPECT_TRUE(std::filesystem::exists(dir / "records.json"));
  std::filesystem::remove_all(dir);
}

TEST(CostPredictRun, SummaryHoldsThePrediction) {
  const nlohmann::json summary = read_json(ddp_run() / "summary.json");
  ASSERT_TRUE(summary.contains("prediction")) << summary.dump();
  const auto& p = summary["prediction"];
  EXPECT_EQ(p["step"], 2);
  EXPECT_EQ(p["samples_per_step"], 128);
  EXPECT_GT(p["step_time_s"].get<double>(), 0);
  EXPECT_NEAR(p["samples_per_s"].get<double>(), 128 / p["step_time_s"].get<double>(), 1e-6);
  EXPECT_GT(p["mfu"].get<double>(), 0);
  EXPECT_LT(p["mfu"].get<double>(), 1);
  EXPECT_GT(p["exposed_comm_s"].get<double>(), 0); // one 1.6 MiB bucket: ready only at the end
}

TEST(CostPredictRun, PredictCommandGivesTheSameNumbers) {
  const nlohmann::json during = read_json(ddp_run() / "summary.json")["prediction"];
  const std::string out = run_stdout("predict " + ddp_run().string() + " --cluster 8xa100-80");
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(nlohmann::json::parse(out), during);
  const nlohmann::json h100 =
      nlohmann::json::parse(run_stdout("predict " + ddp_run().string() + " --cluster 2xh100"));
  EXPECT_LT(h100["step_time_s"].get<double>(), during["step_time_s"].get<double>());
}

// A large model's DDP step on one GPU, as the recorder would hold it: eight Linear(4096, 4096)
// layers, 512 samples per GPU, one bucket per layer.
ComputeRecord run_region(const char* name, int64_t step, double start_s, double end_s) {
  ComputeRecord c;
  c.name = name;
  c.step = step;
  c.start_s = start_s;
  c.end_s = end_s;
  return c;
}

std::vector<Recorder> large_model_records() {
  std::vector<LayerWork> forward;
  const double rows = 512, d = 4096;
  for (int i = 0; i < 8; ++i)
    forward.push_back({"fc" + std::to_string(i), "matmul", 2 * rows * d * d + rows * d,
                       (2 * rows * d + d * d + d) * 4, static_cast<int64_t>((d * d + d) * 4)});
  Recorder r;
  r.compute.push_back(run_region("forward", 1, 0, 1e-3));
  attach_work(r.compute.back(), forward);
  r.compute.push_back(run_region("backward", 1, 1e-3, 2e-3));
  const auto backward = backward_work(forward);
  attach_work(r.compute.back(), backward);
  int64_t seq = 0;
  for (const LayerWork& w : backward)
    r.collectives.push_back(
        {"all_reduce", {0}, w.param_bytes, seq, -1, 2e-3 + seq * 1e-4, 2e-3 + (seq + 1) * 1e-4}),
        ++seq;
  r.compute.push_back(run_region("optimizer", 1, 3e-3, 4e-3));
  attach_work(r.compute.back(), {optimizer_work(8 * (4096 * 4096 + 4096), "adam", false)});
  r.compute.push_back(run_region("forward", 2, 5e-3, 6e-3));
  return {r};
}

TEST(CostPredictRun, DdpScalesOnNvlinkAndLargeModelsDegradeOnPcie3) {
  int64_t samples = 0;
  const auto cnn = records_from_json(read_json(ddp_run() / "records.json"), &samples);
  const auto large = large_model_records();
  const int counts[] = {1, 2, 4, 8};
  double eff[4][4] = {}; // [column][count]
  std::printf("| GPUs | cnn nvlink3 | cnn pcie3 | large nvlink3 | large pcie3 "
              "|\n|---:|---:|---:|---:|---:|\n");
  for (int i = 0; i < 4; ++i) {
    std::printf("| %d |", counts[i]);
    for (int c = 0; c < 4; ++c) {
      const auto& records = c < 2 ? cnn : large;
      const int64_t per_gpu = c < 2 ? samples / 2 : 512;
      const char* link = c % 2 == 0 ? "nvlink3" : "pcie3";
      auto throughput = [&](int n) {
        const ClusterSpec cluster = parse_cluster_spec(std::to_string(n) + "xa100-80", link);
        return predict(resize_data_parallel(records, n), per_gpu * n, cluster).samples_per_s;
      };
      const double tn = throughput(counts[i]);
      eff[c][i] = tn / (counts[i] * throughput(1));
      std::printf(" %.0f samples/s (eff %.2f) |", tn, eff[c][i]);
    }
    std::printf("\n");
  }
  for (int c = 0; c < 4; ++c)
    for (int i = 1; i < 4; ++i)
      EXPECT_LE(eff[c][i], eff[c][i - 1] + 1e-9) << c << " " << i;
  EXPECT_GT(eff[0][3], 0.8);             // the recorded CNN run, 8 A100s over NVLink
  EXPECT_GT(eff[2][3], 0.9);             // large model: its buckets hide behind backward
  EXPECT_LT(eff[3][3], eff[2][3] - 0.2); // ... except over PCIe 3
  for (int i = 1; i < 4; ++i)
    EXPECT_GT(eff[0][i] * counts[i], eff[0][i - 1] * counts[i - 1]);
}

} // namespace
} // namespace meshsim

namespace meshsim {
namespace {

// A pipeline run (GPT, 4 stages, 1F1B) and a dp × tp × pp run: valid traces with one process
// per GPU in each timeline, compute and comm on every one, and a prediction whose bubble is
// visible (the replay honours the send/recv dependencies between stages).
void expect_mesh_run_predicts(const std::string& layout, int gpus) {
  auto d = testing::fresh_dir("predict-mesh");
  const auto r = testing::run_meshsim(
      "train --model gpt --layers 4 --hidden 32 --heads 4 --seq-len 16 --vocab 64 --data synthetic "
      "--synthetic-train 256 --synthetic-test 16 --batch-size 8 --max-steps 4 --cluster 8xa100-80 "
      "--gpus " + std::to_string(gpus) + " " + layout + " --out " + d.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("no prediction"), std::string::npos) << r.output;
  const nlohmann::json trace = read_json(d / "trace.json");
  const auto problems = validate_chrome_trace(trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
  std::set<int> pids;
  std::set<std::pair<int, std::string>> events;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") pids.insert(e["pid"].get<int>());
    if (e["ph"] == "X") events.insert({e["pid"].get<int>(), e["cat"].get<std::string>()});
  }
  EXPECT_EQ(pids.size(), static_cast<size_t>(2 * gpus)) << layout;  // measured and predicted
  for (int pid : pids) {
    EXPECT_TRUE(events.count({pid, "compute"})) << layout << " pid " << pid;
    EXPECT_TRUE(events.count({pid, "comm"})) << layout << " pid " << pid;
  }
  const auto s = read_json(d / "summary.json");
  ASSERT_TRUE(s.contains("prediction")) << layout;
  EXPECT_GT(s["prediction"]["bubble_fraction"].get<double>(), 0.05) << layout;
  std::filesystem::remove_all(d);
}

} // namespace

TEST(CostPredictRun, PipelineAndMeshRunsTraceAndPredict) {
  expect_mesh_run_predicts("--pp 4 --schedule 1f1b --micro-batches 4", 4);
  expect_mesh_run_predicts("--tp 2 --pp 2 --zero 1 --micro-batches 2", 8);
}

} // namespace meshsim
