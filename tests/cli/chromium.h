// Headless Chromium for the page tests: report.html and plan.html loaded from disk, their DOM
// after the scripts ran and their console messages. Skipped, with the reason, where Chromium
// is absent (`make` installs it on Debian: scripts/setup.sh).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_harness.h"

namespace meshsim::testing {

// $MESHSIM_CHROMIUM, else the first of chromium, chromium-browser, google-chrome on PATH.
inline std::string find_chromium() {
  if (const char* env = std::getenv("MESHSIM_CHROMIUM"); env && *env)
    return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (std::system(("command -v " + std::string(name) + " >/dev/null 2>&1").c_str()) == 0)
      return name;
  return "";
}

struct Loaded {
  int code = -1;
  std::string dom;
  std::vector<std::string> console; // the page's console messages and uncaught errors
};

// Loads `page` from disk in headless Chromium and returns the DOM after its scripts ran.
inline Loaded load_in_chromium(const std::string& chromium, const std::filesystem::path& page,
                               const std::filesystem::path& work, const std::string& extra = "") {
  std::filesystem::create_directories(work);
  const std::string cmd = chromium +
                          " --headless --no-sandbox --disable-gpu --no-first-run"
                          " --user-data-dir=" +
                          (work / "profile").string() + " --enable-logging=stderr --v=0 " + extra +
                          " --dump-dom file://" + std::filesystem::absolute(page).string() + " > " +
                          (work / "dom.html").string() + " 2> " + (work / "log.txt").string();
  Loaded out;
  out.code = std::system(("timeout 120 " + cmd).c_str());
  out.dom = read_text(work / "dom.html");
  std::istringstream log(read_text(work / "log.txt"));
  for (std::string line; std::getline(log, line);)
    if (line.find(":CONSOLE") != std::string::npos)
      out.console.push_back(line);
  return out;
}

inline int count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// Nothing in the page is fetched: no external script, style, image or frame.
inline void expect_self_contained(const std::string& page) {
  EXPECT_FALSE(
      std::regex_search(page, std::regex("<(script|img|iframe)[^>]*src=", std::regex::icase)));
  EXPECT_FALSE(std::regex_search(page, std::regex("<link[^>]*href=", std::regex::icase)));
  EXPECT_FALSE(
      std::regex_search(page, std::regex("@import|url\\(\\s*['\"]?https?:", std::regex::icase)));
}

} // namespace meshsim::testing
