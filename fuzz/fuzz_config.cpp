// Fuzzes config.json (config/config.h): bytes -> parse_json as `train --config` reads it (a
// key twice refused, in one line) -> config_from_json -> validate; a configuration that passes must
// survive to_json -> config_from_json -> to_json unchanged. validate builds the cnn or lenet
// model to count its pipeline stages, which is slow but kept: it is what a real --config runs.
// Correct behaviour: JsonError or std::invalid_argument with a one-line message are the only
// exceptions that may escape; anything else, a crash or undefined behaviour is a bug.
#include "base/json_input.h"
#include "fuzz_common.h"
#include "config/config.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    doc = meshsim::parse_json(meshsim::fuzz::as_string(data, size), "config.json");
  } catch (const meshsim::JsonError& e) {
    meshsim::fuzz::expect_one_line(e);
    return 0;
  }
  try {
    meshsim::TrainConfig config = meshsim::config_from_json(doc);
    meshsim::validate(config);
    const nlohmann::json saved = meshsim::to_json(config);
    if (meshsim::to_json(meshsim::config_from_json(saved)) != saved)
      std::abort();
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
