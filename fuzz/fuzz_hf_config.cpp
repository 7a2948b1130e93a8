// Fuzzes --hf-config's parser (models/hf_config.h): bytes -> parse_json as a config.json is
// read (a key twice refused) -> parse_hf_config -> validate_shape. A file that passes both and
// has at most 8 layers is built on the meta device (shapes only), whose parameters must number
// what the closed form says. Correct behaviour: JsonError or std::invalid_argument with a
// one-line message are the only exceptions that may escape; anything else, a crash, undefined
// behaviour or a count that differs is a bug.
#include "base/json_input.h"
#include "config/config.h"
#include "fuzz_common.h"
#include "models/hf_config.h"
#include "models/llama.h"

#include <cstdlib>
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
    const meshsim::HfModel model = meshsim::parse_hf_config(doc, "config.json");
    meshsim::validate_shape(model.family, model.shape);
    if (model.shape.layers > 8)
      return 0;
    meshsim::ModelOptions options;
    options.shape = model.shape;
    options.device = torch::kMeta;
    const auto built = meshsim::build_model(model.family, options);
    if (meshsim::count_parameters(*built) != meshsim::llama_parameter_count(model.shape))
      std::abort();
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
