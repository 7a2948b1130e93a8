// A request to `meshsim serve`'s /api/plan, checked and turned into `meshsim plan`'s flags.
//
// The body is one JSON object (docs/serve.md lists its fields). Every field is checked here
// for its type, its range and the characters it may hold, so what reaches the plan's command
// line is always a flag and a plain value; the plan itself then checks the layout as `meshsim
// plan` does (a layout that does not divide is its one-line error).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshsim {

/// A request refused: the HTTP status to answer with and a one-line reason.
class RequestError : public std::runtime_error {
public:
  RequestError(int status, const std::string& what) : std::runtime_error(what), status_(status) {}
  int status() const { return status_; }

private:
  int status_;
};

struct PlanRequest {
  /// `meshsim plan`'s flags, after "plan --json" (without --hf-config, whose file the server
  /// writes: `hf_config`).
  std::vector<std::string> flags;
  nlohmann::json hf_config; // a Hugging Face config.json given inline, or null
  bool search = false;
  /// The same plan from a shell: "meshsim plan --preset llama3-8b --cluster 8xh100 ...".
  std::string command_line() const;
};

/// Parses and checks `body`. Throws RequestError (400, one line) for anything but a JSON object
/// of known fields with values of their types: no preset and no hf_config (or both), an unknown
/// preset, a cluster or layout value out of range or with characters no value has.
PlanRequest parse_plan_request(const std::string& body);

/// The longest config.json parse_plan_request takes inline, in bytes once serialized.
constexpr size_t kMaxHfConfigBytes = 256 * 1024;

} // namespace meshsim
