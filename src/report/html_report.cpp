// report.html: the page around the data (report_data.h), written atomically.
#include "report/html_report.h"

#include <fstream>

#include "base/atomic_file.h"
#include "report/plan_page.h"
#include "report/report_assets.h"

namespace meshsim {
namespace {

} // namespace

nlohmann::json html_report_data(const HtmlReportInput& in) {
  static const std::vector<MemorySample> no_samples;
  static const std::vector<Recorder> no_recorders;
  const auto& samples = in.samples ? *in.samples : no_samples;
  const auto& recorders = in.recorders ? *in.recorders : no_recorders;

  std::vector<GpuPeak> peaks;
  if (in.summary.contains("gpus") && in.summary["gpus"].is_array())
    for (const auto& g : in.summary["gpus"]) {
      GpuPeak p;
      p.bytes = g.value("peak_bytes", int64_t{0});
      if (g.contains("peak_by_category") && g["peak_by_category"].is_object())
        for (auto c : kAllCategories)
          p.by_category[static_cast<size_t>(c)] =
              g["peak_by_category"].value(category_name(c), int64_t{0});
      peaks.push_back(p);
    }
  if (peaks.size() != in.capacities.size())
    peaks.clear();

  nlohmann::json categories = nlohmann::json::array();
  for (auto c : kAllCategories)
    categories.push_back(category_name(c));
  nlohmann::json prediction =
      in.summary.contains("prediction") ? in.summary["prediction"] : nlohmann::json(nullptr);
  return {{"title", in.title},
          {"summary", in.summary},
          {"categories", categories},
          {"metrics", metrics_report_data(in.metrics, in.limits.max_metric_points)},
          {"memory", memory_report_data(samples, in.capacities, peaks, in.limits)},
          {"collectives", collectives_report_data(recorders)},
          {"prediction", prediction}};
}

std::string html_report_page(const nlohmann::json& data, const std::string& title) {
  std::string page;
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += "<title>" + html_escape(title) + "</title>\n<style>\n";
  page += report_css();
  page += "</style>\n</head>\n<body>\n<main id=\"report\"></main>\n";
  page += "<script type=\"application/json\" id=\"meshsim-data\">";
  page += script_safe_json(data);
  page += "</script>\n<script>\n";
  page += chart_js();
  page += "\n</script>\n<script>\n";
  page += report_js();
  page += "\n</script>\n</body>\n</html>\n";
  return page;
}

bool write_html_report(const std::filesystem::path& path, const HtmlReportInput& input,
                       std::string* error) {
  try {
    write_file_atomic(path, html_report_page(html_report_data(input), input.title));
    return true;
  } catch (const std::exception& e) {
    if (error)
      *error = e.what();
  } catch (...) {
    if (error)
      *error = "an unknown error";
  }
  return false;
}

std::vector<nlohmann::json> read_metrics_lines(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object())
      out.push_back(std::move(j));
  }
  return out;
}

} // namespace meshsim
