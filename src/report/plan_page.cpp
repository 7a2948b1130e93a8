// plan.html and the serve page: the same style, renderer and Chart.js, inline.
#include "report/plan_page.h"

#include <fmt/format.h>

#include "base/atomic_file.h"
#include "report/report_assets.h"

namespace meshsim {
namespace {

std::string head(const std::string& title) {
  std::string page;
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += "<title>" + html_escape(title) + "</title>\n<style>\n";
  page += plan_css();
  page += "</style>\n</head>\n<body>\n";
  return page;
}

std::string scripts(std::string_view page_js) {
  std::string out = "<script>\n";
  out += chart_js();
  out += "\n</script>\n<script>\n";
  out += plan_js();
  out += "\n</script>\n";
  if (!page_js.empty()) {
    out += "<script>\n";
    out += page_js;
    out += "\n</script>\n";
  }
  return out + "</body>\n</html>\n";
}

std::string title_of(const nlohmann::json& plan, const nlohmann::json& search) {
  const nlohmann::json& doc = plan.is_object() ? plan : search;
  if (!doc.is_object())
    return "meshsim plan";
  const std::string preset = doc.value("preset", "");
  return fmt::format("meshsim plan{}: {} on {}", search.is_object() ? " --search" : "",
                     preset.empty() ? doc.value("model", "?") : preset, doc.value("cluster", "?"));
}

} // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

std::string script_safe_json(const nlohmann::json& data) {
  std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

nlohmann::json plan_page_data(const nlohmann::json& plan, const nlohmann::json& search) {
  return {{"title", title_of(plan, search)}, {"plan", plan}, {"search", search}};
}

std::string plan_page(const nlohmann::json& data) {
  std::string page = head(data.value("title", "meshsim plan"));
  page += "<main id=\"plan\"></main>\n";
  page += "<script type=\"application/json\" id=\"meshsim-data\">";
  page += script_safe_json(data);
  page += "</script>\n";
  return page + scripts({});
}

void write_plan_page(const std::filesystem::path& path, const nlohmann::json& plan,
                     const nlohmann::json& search) {
  write_file_atomic(path, plan_page(plan_page_data(plan, search)));
}

std::string serve_page() {
  return head("meshsim serve") + "<main id=\"serve\"></main>\n" + scripts(serve_js());
}

} // namespace meshsim
