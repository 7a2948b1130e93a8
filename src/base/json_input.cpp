// parse_json(): nlohmann's parser with a callback that keeps each open object's keys.
#include "base/json_input.h"

#include <set>
#include <vector>

#include <fmt/format.h>

#include "base/printable.h"

namespace meshsim {

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open_objects;
  auto check_keys = [&](int /*depth*/, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      open_objects.pop_back();
    } else if (event == Event::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second)
        throw JsonError(fmt::format("{}: key \"{}\" appears twice in one object", what, printable(key)));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, check_keys);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the bytes it stopped at: printable keeps the line readable.
    throw JsonError(fmt::format("{}: not valid JSON ({})", what, printable(e.what())));
  }
}

} // namespace meshsim
