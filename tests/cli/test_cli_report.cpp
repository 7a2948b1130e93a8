// report.html in a real browser: a run's page loads in headless Chromium from disk with no
// console message, every chart draws (the page marks <body data-charts-rendered="N">), and
// nothing in it reaches the network. Skipped, with the reason, where Chromium is absent
// (`make` installs it on Debian: scripts/setup.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chromium.h"
#include "cli_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

// The page's charts: the marker its script sets once all are drawn, and one canvas each that
// Chart.js sized (a canvas never drawn keeps no width attribute).
void expect_rendered(const Loaded& l, int charts) {
  EXPECT_EQ(l.code, 0);
  for (const auto& line : l.console)
    ADD_FAILURE() << "console: " << line;
  EXPECT_FALSE(std::regex_search(l.dom, std::regex("<body[^>]*data-report-errors=\"[0-9]")))
      << l.dom.substr(0, 2000);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(l.dom, m, std::regex("data-charts-rendered=\"(\\d+)\"")))
      << l.dom.substr(0, 2000);
  EXPECT_EQ(std::stoi(m[1]), charts);
  EXPECT_EQ(count(l.dom, "<canvas id=\"chart-"), charts);
  EXPECT_EQ(count(l.dom, "<canvas id=\"chart-[^\"]*\"[^>]*\\swidth=\"[1-9]"), charts);
  for (const char* id : {"chart-loss", "chart-throughput", "chart-memory-step",
                         "chart-memory-peaks", "chart-memory-strip", "gpu-select", "step-select"})
    EXPECT_NE(l.dom.find(id), std::string::npos) << id;
}

} // namespace

TEST(CliReport, PageLoadsInHeadlessChromiumWithEveryChartDrawn) {
  const auto out = fresh_dir("report-4");
  // A prediction too (--cluster), so every section of the page is drawn.
  auto r = run_meshsim(kSmallTrain +
                       "--gpus 4 --batch-size 16 --max-steps 6 --log-every 1 "
                       "--cluster 4xa100-80 --out " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_TRUE(fs::exists(out / "report.html")) << r.output;
  const std::string page = read_text(out / "report.html");
  expect_self_contained(page);
  EXPECT_NE(page.find("\"prediction\":{"), std::string::npos);
  std::cout << "report.html at 4 GPUs: " << page.size() << " bytes\n";

  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "no Chromium (apt-get install chromium): the page was written but not loaded";
  // Offline: every network request refused; the page must not need one.
  const auto l =
      load_in_chromium(chromium, out / "report.html", out / "chromium",
                       "--host-resolver-rules='MAP * ~NOTFOUND' --proxy-server=127.0.0.1:9");
  // loss, throughput, memory step, peaks, strip, collectives by group and size, prediction.
  expect_rendered(l, 8);
  EXPECT_NE(l.dom.find("Prediction on"), std::string::npos);
  fs::remove_all(out);
}

TEST(CliReport, FailedRunStillGetsAPage) {
  const auto out = fresh_dir("report-oom");
  auto r = run_meshsim(kSmallTrain + "--gpus 2 --gpu-mem 1MiB --out " + out.string());
  ASSERT_EQ(r.code, 4) << r.output;
  ASSERT_TRUE(fs::exists(out / "report.html")) << r.output;
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "no Chromium (apt-get install chromium)";
  const auto l = load_in_chromium(chromium, out / "report.html", out / "chromium");
  EXPECT_EQ(l.code, 0);
  for (const auto& line : l.console)
    ADD_FAILURE() << "console: " << line;
  EXPECT_FALSE(std::regex_search(l.dom, std::regex("<body[^>]*data-report-errors=\"[0-9]")))
      << l.dom.substr(0, 2000);
  EXPECT_NE(l.dom.find("data-charts-rendered"), std::string::npos);
  EXPECT_NE(l.dom.find("failed"), std::string::npos);
  fs::remove_all(out);
}

// 64 virtual GPUs: the page stays under 5 MB and draws (identical GPUs grouped).
TEST(CliReport, SixtyFourGpusMakeAPageUnderFiveMegabytes) {
  const auto out = fresh_dir("report-64");
  const auto start = std::chrono::steady_clock::now();
  auto r = run_meshsim("train --data synthetic --synthetic-train 1024 --synthetic-test 64 "
                       "--gpus 64 --batch-size 2 --max-steps 4 --out " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto size = fs::file_size(out / "report.html");
  std::cout << "64 GPUs: run " << seconds << " s, report.html " << size << " bytes\n";
  EXPECT_LT(size, 5u * 1000 * 1000);
  expect_self_contained(read_text(out / "report.html"));
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "no Chromium (apt-get install chromium)";
  const auto l = load_in_chromium(chromium, out / "report.html", out / "chromium");
  expect_rendered(l, 7); // no prediction
  fs::remove_all(out);
}

// A mixture of experts' run on 4 GPUs with ep 2: routing.csv holds every step, rank and MoE
// layer, and what it says adds up: each rank's tokens made top_k assignments each, and each
// expert ran exactly the assignments the two ranks of its ep group sent it. The page draws
// the routing section's two charts beside the others, with no console message.
TEST(CliReport, ExpertParallelRunRecordsItsRoutingAndDrawsIt) {
  const fs::path out = fresh_dir("routing");
  const int64_t batch = 4, seq = 16, top_k = 2, experts = 4, steps = 3;
  auto r = run_meshsim(fmt::format(
      "train --model llama --layers 3 --hidden 16 --heads 4 --seq-len {} --moe-experts {} "
      "--moe-top-k {} --moe-dense-layers 1 --gpus 4 --ep 2 --batch-size {} --max-steps {} "
      "--data synthetic --synthetic-train 256 --synthetic-test 16 --out {}",
      seq, experts, top_k, batch, steps, out.string()));
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream csv(read_text(out / "routing.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "step,rank,layer,expert,routed,ran");
  // (step, rank, layer) -> assignments; (step, layer, expert) -> sent, and ran.
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> per_rank, sent, ran;
  int64_t rows = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream cells(line);
    for (std::string c; std::getline(cells, c, ',');)
      f.push_back(c);
    if (f.size() == 5)
      f.push_back("");
    ASSERT_EQ(f.size(), 6u) << line;
    const int64_t step = std::stoll(f[0]), rank = std::stoll(f[1]), layer = std::stoll(f[2]),
                  expert = std::stoll(f[3]), routed = std::stoll(f[4]);
    per_rank[{step, rank, layer}] += routed;
    // ep groups are {0, 1} and {2, 3}: an expert's rows come from its group's two ranks.
    sent[{step, layer, expert * 2 + rank / 2}] += routed;
    if (!f[5].empty())
      ran[{step, layer, expert * 2 + rank / 2}] += std::stoll(f[5]);
    ++rows;
  }
  EXPECT_EQ(rows, steps * 4 * 2 * experts); // 4 ranks, 2 MoE layers (1 and 2)
  for (const auto& [key, n] : per_rank)
    EXPECT_EQ(n, batch * seq * top_k) << "step " << std::get<0>(key) << " rank "
                                      << std::get<1>(key);
  EXPECT_EQ(ran, sent);
  const nlohmann::json routing = read_json(out / "summary.json")["routing"];
  EXPECT_EQ(routing["experts"], experts);
  EXPECT_EQ(routing["layers"], nlohmann::json({1, 2}));
  EXPECT_EQ(routing["steps"].size(), static_cast<size_t>(steps));
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "no Chromium (apt-get install chromium): the page was written but not loaded";
  const Loaded l = load_in_chromium(chromium, out / "report.html", out / "browser");
  expect_rendered(l, 9); // the 7 of a run without a prediction, and the routing's 2
  for (const char* id : {"chart-routing-tokens", "chart-routing-imbalance"})
    EXPECT_NE(l.dom.find(id), std::string::npos) << id;
}
