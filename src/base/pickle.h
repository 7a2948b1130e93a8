// Python's pickle format (protocol 2) for JSON-shaped values, so that Python reads meshsim's
// files with pickle.load and no meshsim code: objects become dicts, arrays lists, integers
// ints (any size up to 64 bits), floats floats, and true/false/null True/False/None.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace meshsim {

/// The pickle of `value` (protocol 2, no memo). Throws std::invalid_argument for a value
/// JSON cannot hold (never from a parsed or built nlohmann::json).
std::string to_pickle(const nlohmann::json& value);

} // namespace meshsim
