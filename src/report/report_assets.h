// The files report.html, plan.html and the serve page carry inline: the vendored charting
// library (third_party/chartjs), the pages' scripts and styles (src/report/assets/). The build embeds them
// (cmake/embed_assets.cmake), so the binary writes a self-contained page.
#pragma once

#include <cstddef>
#include <string_view>

namespace meshsim {
namespace assets {
extern const unsigned char kChartJs[];
extern const std::size_t kChartJs_size;
extern const unsigned char kReportJs[];
extern const std::size_t kReportJs_size;
extern const unsigned char kReportCss[];
extern const std::size_t kReportCss_size;
extern const unsigned char kPlanJs[];
extern const std::size_t kPlanJs_size;
extern const unsigned char kPlanCss[];
extern const std::size_t kPlanCss_size;
extern const unsigned char kServeJs[];
extern const std::size_t kServeJs_size;
} // namespace assets

/// Chart.js (the vendored UMD build), as text.
inline std::string_view chart_js() {
  return {reinterpret_cast<const char*>(assets::kChartJs), assets::kChartJs_size};
}
/// The report page's script (src/report/assets/report.js).
inline std::string_view report_js() {
  return {reinterpret_cast<const char*>(assets::kReportJs), assets::kReportJs_size};
}
/// The report page's style (src/report/assets/report.css).
inline std::string_view report_css() {
  return {reinterpret_cast<const char*>(assets::kReportCss), assets::kReportCss_size};
}

/// plan.html's renderer, shared with the serve page (src/report/assets/plan.js).
inline std::string_view plan_js() {
  return {reinterpret_cast<const char*>(assets::kPlanJs), assets::kPlanJs_size};
}
/// plan.html's and the serve page's style (src/report/assets/plan.css).
inline std::string_view plan_css() {
  return {reinterpret_cast<const char*>(assets::kPlanCss), assets::kPlanCss_size};
}
/// The serve page's form and comparison (src/report/assets/serve.js).
inline std::string_view serve_js() {
  return {reinterpret_cast<const char*>(assets::kServeJs), assets::kServeJs_size};
}

} // namespace meshsim
