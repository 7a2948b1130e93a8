// Tests for report.html's data and page (src/report/report_data.h, html_report.h), without a
// browser; tests/cli/test_cli_report.cpp loads real runs' pages in headless Chromium.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "report/html_report.h"
#include "report/report_data.h"

namespace fs = std::filesystem;
using namespace meshsim;

namespace {

MemorySample sample(double t, int64_t step, const std::string& phase, std::vector<CategoryBytes> gpus) {
  MemorySample s;
  s.time_s = t;
  s.step = step;
  s.phase = phase;
  for (const auto& b : gpus) {
    int64_t total = 0;
    for (int64_t x : b)
      total += x;
    s.bytes.push_back(total);
  }
  s.by_category = std::move(gpus);
  return s;
}

// Four GPUs, three steps; GPU 0 holds more activations (DataParallel's GPU 0), 1-3 are alike.
std::vector<MemorySample> four_gpus() {
  std::vector<MemorySample> out;
  double t = 0;
  for (int64_t step = 1; step <= 3; ++step) {
    const CategoryBytes idle{100, 0, 200, 0, 0, 0}, fwd{100, 0, 200, 50, 0, 0},
        bwd{100, 100, 200, 10, 0, 0};
    const CategoryBytes fwd0{100, 0, 200, 150, 0, 0};
    out.push_back(sample(t += 0.001, step, "batch", {idle, idle, idle, idle}));
    out.push_back(sample(t += 0.001, step, "forward", {fwd0, fwd, fwd, fwd}));
    out.push_back(sample(t += 0.001, step, "forward", {fwd0, fwd, fwd, fwd})); // another rank's
    out.push_back(sample(t += 0.001, step, "backward", {bwd, bwd, bwd, bwd}));
    out.push_back(sample(t += 0.001, step, "optimizer", {idle, idle, idle, idle}));
  }
  return out;
}

} // namespace

TEST(HtmlReportData, RepresentativeStepIsTheSecondToLast) {
  EXPECT_EQ(report_representative_step(four_gpus()), 2);
  EXPECT_EQ(report_representative_step({}), -1);
  EXPECT_EQ(report_representative_step({sample(0, 1, "batch", {CategoryBytes{}})}), 1);
  // Step 0 (setup, before the first step) is not a training step.
  EXPECT_EQ(report_representative_step(
                {sample(0, 0, "model", {CategoryBytes{}}), sample(1, 1, "batch", {CategoryBytes{}})}),
            1);
}

TEST(HtmlReportData, IdenticalGpusAreOneGroupAndChangesArePoints) {
  const auto samples = four_gpus();
  const GpuPeak first{460, {100, 100, 200, 150, 0, 0}}, other{420, {100, 100, 200, 60, 0, 0}};
  const auto m =
      memory_report_data(samples, {1000, 1000, 1000, 1000}, {first, other, other, other});
  EXPECT_EQ(m["groups"], nlohmann::json::parse("[[0],[1,2,3]]"));
  EXPECT_EQ(m["group_of"], nlohmann::json::parse("[0,1,1,1]"));
  EXPECT_EQ(m["representative_step"], 2);
  // Every step fits the budget; each has one series per group.
  ASSERT_EQ(m["detail"].size(), 3u);
  const auto& rows = m["detail"]["2"][1];
  // batch, forward, backward, optimizer: the repeated forward sample is not a change.
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0][0], 0.0); // ms from the step's first sample
  EXPECT_EQ(m["phases"][rows[1][1].get<int>()], "forward");
  EXPECT_EQ(rows[1][2 + 3], 50);  // activations
  EXPECT_EQ(rows[2][2 + 1], 100); // gradients in backward
  // The run's strip: one column per step here, the step's peak (GPU 0: forward's 450, the
  // others backward's 410).
  ASSERT_EQ(m["strip"][0].size(), 3u);
  EXPECT_EQ(m["strip"][0][1][0], 2);
  EXPECT_EQ(m["strip"][0][1][2 + 3], 150);
  EXPECT_EQ(m["strip"][1][1][2 + 1], 100);
  // Peaks: the sampled peak by category and the allocator's peak.
  EXPECT_EQ(m["peaks"][0]["sampled"], nlohmann::json::parse("[100,0,200,150,0,0]"));
  EXPECT_EQ(m["peaks"][0]["peak"], 460);
  EXPECT_EQ(m["peaks"][3]["capacity"], 1000);
}

TEST(HtmlReportData, GpusWithTheSamePeaksAreOneGroupWhateverTheirSamples) {
  // Ranks sample at different moments, so replicas' samples can differ; their peaks cannot.
  const GpuPeak same{400, {100, 100, 200, 100, 0, 0}};
  const auto m =
      memory_report_data(four_gpus(), {1000, 1000, 1000, 1000}, {same, same, same, same});
  EXPECT_EQ(m["groups"], nlohmann::json::parse("[[0,1,2,3]]"));
  // Without the allocator's peaks, the samples decide.
  EXPECT_EQ(memory_report_data(four_gpus(), {1000, 1000, 1000, 1000}, {})["groups"].size(), 2u);
  // Another capacity is another group.
  EXPECT_EQ(
      memory_report_data(four_gpus(), {1000, 1000, 1000, 2000}, {same, same, same, same})["groups"]
          .size(),
      2u);
}

TEST(HtmlReportData, DetailStaysWithinItsBudget) {
  std::vector<MemorySample> samples;
  for (int64_t step = 1; step <= 500; ++step)
    for (int p = 0; p < 4; ++p)
      samples.push_back(
          sample(static_cast<double>(step) + 0.1 * p, step, "phase", {CategoryBytes{step, p, 0, 0, 0, 0}}));
  ReportLimits limits;
  limits.detail_budget_bytes = 20000;
  limits.max_strip_columns = 100;
  const auto m = memory_report_data(samples, {1 << 20}, {}, limits);
  EXPECT_LT(m["detail"].dump().size(), 25000u);
  EXPECT_GT(m["detail"].size(), 10u);
  EXPECT_TRUE(m["detail"].contains("499")); // the representative step is always there
  EXPECT_TRUE(m["detail"].contains("1"));
  EXPECT_TRUE(m["detail"].contains("500"));
  // 500 steps in 100 columns of 5 steps, each the most of its steps.
  ASSERT_EQ(m["strip"][0].size(), 100u);
  EXPECT_EQ(m["strip"][0][0][0], 1);
  EXPECT_EQ(m["strip"][0][0][1], 5);
  EXPECT_EQ(m["strip"][0][0][2], 5);
}

TEST(HtmlReportData, CollectivesCountedOncePerGroupBySize) {
  std::vector<Recorder> ranks(4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].collectives.push_back({"all_reduce", {0, 1, 2, 3}, 4096, 0, -1, 0.0, 0.5});
    ranks[r].collectives.push_back({"all_reduce", {0, 1, 2, 3}, 5000, 1, -1, 1.0, 1.5});
    ranks[r].collectives.push_back({"all_gather", {r % 2, r % 2 + 2}, 64, 0, -1, 0.0, 0.1});
  }
  ranks[0].collectives.push_back({"send", {0, 1}, 128, 0, 1, 0.0, 0.1});
  ranks[1].collectives.push_back({"recv", {0, 1}, 128, 0, 0, 0.0, 0.1});
  const auto c = collectives_report_data(ranks);
  ASSERT_EQ(c.size(), 4u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& x : c)
    by[x["group"].get<std::string>() + " " + x["op"].get<std::string>()] = x;
  const auto& ar = by.at("0-3 all_reduce");
  EXPECT_EQ(ar["calls"], 2);
  EXPECT_EQ(ar["bytes"], 9096);
  EXPECT_EQ(ar["ranks"], 4);
  EXPECT_EQ(ar["sizes"], nlohmann::json::parse("[[12,2]]")); // both in [4 KiB, 8 KiB)
  EXPECT_DOUBLE_EQ(ar["seconds"].get<double>(), 1.0);
  EXPECT_EQ(by.at("0,2 all_gather")["calls"], 1);
  EXPECT_EQ(by.at("1,3 all_gather")["calls"], 1);
  EXPECT_EQ(by.at("0→1 send")["bytes"], 128);
}

TEST(HtmlReportData, GroupLabelsAreShort) {
  EXPECT_EQ(group_label({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(group_label({0, 8, 16, 24, 32}), "0,8,…,32");
  EXPECT_EQ(group_label({1, 5}), "1,5");
  EXPECT_EQ(group_label({3}), "3");
}

TEST(HtmlReportData, MetricsAreThinnedKeepingTheLast) {
  std::vector<nlohmann::json> lines;
  for (int s = 1; s <= 1000; ++s)
    lines.push_back({{"step", s}, {"loss", 1.0 / s}, {"samples_per_s", 10}, {"lr", 0.1}});
  lines.push_back(nlohmann::json::object()); // not a step: left out
  const auto m = metrics_report_data(lines, 100);
  ASSERT_EQ(m.size(), 100u);
  EXPECT_EQ(m.front()[0], 1);
  EXPECT_EQ(m.back()[0], 1000);
  EXPECT_EQ(m.back()[2], 10);
}

TEST(HtmlReport, PageIsSelfContainedAndItsDataCannotEndTheScript) {
  const auto samples = four_gpus();
  HtmlReportInput in;
  in.title = "meshsim: <test> & run";
  in.summary = {{"status", "ok"}, {"note", "</script><script>alert(1)</script>"}};
  in.samples = &samples;
  in.capacities = {1000, 1000, 1000, 1000};
  const std::string page = html_report_page(html_report_data(in), in.title);
  EXPECT_NE(page.find("<title>meshsim: &lt;test&gt; &amp; run</title>"), std::string::npos);
  EXPECT_EQ(page.find("alert(1)</script>"), std::string::npos);
  EXPECT_NE(page.find("<\\/script><script>alert(1)<\\/script>"), std::string::npos);
  EXPECT_NE(page.find("Chart.js v4"), std::string::npos);          // the library is inline
  EXPECT_NE(page.find("data-charts-rendered"), std::string::npos); // and the page's script
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  // Exactly three script elements end: the data, Chart.js, the page's script.
  size_t ends = 0;
  for (size_t at = page.find("</script"); at != std::string::npos;
       at = page.find("</script", at + 1))
    ++ends;
  EXPECT_EQ(ends, 3u);
}

TEST(HtmlReport, AFailedWriteIsOneLineNeverAThrow) {
  const auto samples = four_gpus();
  HtmlReportInput in;
  in.samples = &samples;
  in.capacities = {1000, 1000, 1000, 1000};
  std::string error;
  const fs::path missing = fs::temp_directory_path() /
                           ("meshsim-no-such-dir-" + std::to_string(::getpid())) / "report.html";
  EXPECT_FALSE(write_html_report(missing, in, &error));
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(error.find('\n'), std::string::npos);
  // Capacities that do not match the samples' GPUs: still a page, never a crash.
  in.capacities = {1000};
  const fs::path ok =
      fs::temp_directory_path() / ("meshsim-report-" + std::to_string(::getpid()) + ".html");
  EXPECT_TRUE(write_html_report(ok, in, &error)) << error;
  fs::remove(ok);
}
