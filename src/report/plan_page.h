// plan.html, the page `meshsim plan --out` writes beside plan.json, and the page `meshsim
// serve` answers with. Both carry the same style and renderer (src/report/assets/plan.js) and
// the vendored Chart.js inline: plan.html opens from disk with no network.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace meshsim {

/// The data plan.html draws: {"title", "plan": a plan's document (plan --json) or null,
/// "search": a search's document (plan --search --json) or null}.
nlohmann::json plan_page_data(const nlohmann::json& plan, const nlohmann::json& search);

/// The self-contained page for `data` (plan_page_data).
std::string plan_page(const nlohmann::json& data);

/// Writes plan_page(plan_page_data(plan, search)) to `path` atomically.
void write_plan_page(const std::filesystem::path& path, const nlohmann::json& plan,
                     const nlohmann::json& search = nullptr);

/// The page of `meshsim serve`: the form, and each answer drawn as plan.html draws it.
std::string serve_page();

/// Text inside a <script> element ends at the first "</": the JSON says "<\/" instead.
std::string script_safe_json(const nlohmann::json& data);

/// `text` with &, <, > and " escaped for HTML.
std::string html_escape(const std::string& text);

} // namespace meshsim
