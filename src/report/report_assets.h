// The files report.html carries inline: the vendored charting library (third_party/chartjs),
// the page's script and its style (src/report/assets/). The build embeds them
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

} // namespace meshsim
