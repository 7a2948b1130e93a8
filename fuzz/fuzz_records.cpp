// Fuzzes records_from_json (cost/predict.h): a run folder's records.json, which
// `meshsim predict` reads. The bytes go through nlohmann::json::parse without exceptions
// (text that is not JSON is the caller's error to report); a parsed document must give records
// or std::invalid_argument with a one-line message. Anything else escaping, a crash or
// undefined behaviour is a bug.
#include "cost/predict.h"
#include "fuzz_common.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return 0;
  try {
    int64_t samples_per_step = 0;
    (void)meshsim::records_from_json(doc, &samples_per_step);
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
