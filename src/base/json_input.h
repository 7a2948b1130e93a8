// JSON from outside (config.json, records.json, a checkpoint's manifest, a run part), parsed
// strictly: a duplicate key is refused rather than silently resolved to its last value.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace meshsim {

/// Text that is not JSON, or JSON with a key twice in one object. The message is one printable
/// line that starts with the `what` given to parse_json.
class JsonError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// `text` parsed as JSON; throws JsonError "WHAT: not valid JSON (...)" or "WHAT: key \"k\"
/// appears twice in one object".
nlohmann::json parse_json(const std::string& text, const std::string& what);

} // namespace meshsim
