// report.html: one self-contained page per run folder (summary, loss and throughput, the
// memory of every virtual GPU by category, the collectives, the prediction), drawn in the
// browser by the vendored Chart.js from data embedded in the page. It opens from disk with no
// network: the library, script, style and data are all inline.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "memory/timeline.h"
#include "report/report_data.h"

namespace meshsim {

/// What the page is made of. `summary` is summary.json's document (its "gpus" give each GPU's
/// peak, its "prediction" the prediction when there is one); `recorders` may be empty (a run
/// that failed before its records were gathered).
struct HtmlReportInput {
  std::string title;
  nlohmann::json summary;
  std::vector<nlohmann::json> metrics; // metrics.jsonl's lines
  const std::vector<MemorySample>* samples = nullptr;
  std::vector<int64_t> capacities;
  const std::vector<Recorder>* recorders = nullptr;
  ReportLimits limits;
};

/// The JSON document the page draws.
nlohmann::json html_report_data(const HtmlReportInput& input);

/// The page: `data` (html_report_data) embedded as JSON, with Chart.js, the page's script
/// and its style inline. No reference leaves the file.
std::string html_report_page(const nlohmann::json& data, const std::string& title);

/// Writes report.html atomically. Returns false and sets *error (one line) on any failure;
/// never throws: a report that cannot be written costs the report, never the run.
bool write_html_report(const std::filesystem::path& path, const HtmlReportInput& input,
                       std::string* error);

/// metrics.jsonl's lines that parse as JSON objects (a missing file: none).
std::vector<nlohmann::json> read_metrics_lines(const std::filesystem::path& path);

} // namespace meshsim
