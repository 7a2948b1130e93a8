// Fuzzes records_from_json (cost/predict.h): a run folder's records.json, which
// `meshsim predict` reads. The bytes go through parse_json as predict reads them (not JSON, or
// a key twice: JsonError in one line); a parsed document must give records or DataError with a
// one-line message. Anything else escaping, a crash or
// undefined behaviour is a bug.
#include "base/errors.h"
#include "base/json_input.h"
#include "cost/predict.h"
#include "fuzz_common.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    doc = meshsim::parse_json(meshsim::fuzz::as_string(data, size), "records.json");
  } catch (const meshsim::JsonError& e) {
    meshsim::fuzz::expect_one_line(e);
    return 0;
  }
  try {
    int64_t samples_per_step = 0;
    (void)meshsim::records_from_json(doc, &samples_per_step);
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
