// Fuzzes config.json (train/config.h): bytes -> JSON (no exceptions; text that is not JSON is
// the caller's error) -> config_from_json -> validate; a configuration that passes must
// survive to_json -> config_from_json -> to_json unchanged. validate builds the cnn or lenet
// model to count its pipeline stages, which is slow but kept: it is what a real --config runs.
// Correct behaviour: std::invalid_argument with a one-line message is the only exception that
// may escape; anything else, a crash or undefined behaviour is a bug.
#include "fuzz_common.h"
#include "train/config.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return 0;
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
