// Fuzzes what --init-from reads from outside: a model.safetensors file
// (base/safetensors.h) and a config.json checked against a run's shape
// (train/hf_format_families.h). The first byte picks which; the rest is the input. A file
// that parses is written again and must read back the same.
// Correct behaviour: DataError or std::invalid_argument, each with a one-line message, are the
// only exceptions that may escape; anything else, a crash, a hang or undefined behaviour is a
// bug.
#include "base/errors.h"
#include "base/json_input.h"
#include "base/safetensors.h"
#include "fuzz_common.h"
#include "train/hf_format_families.h"

namespace {

void fuzz_safetensors_file(const std::string& bytes) {
  const meshsim::SafetensorsFile file = meshsim::parse_safetensors(bytes);
  const meshsim::SafetensorsFile again =
      meshsim::parse_safetensors(meshsim::safetensors_bytes(file.tensors, file.metadata));
  if (again.tensors.size() != file.tensors.size() || again.metadata != file.metadata)
    std::abort();
  for (size_t i = 0; i < file.tensors.size(); ++i)
    if (again.tensors[i].data != file.tensors[i].data ||
        again.tensors[i].shape != file.tensors[i].shape)
      std::abort();
}

void fuzz_hf_config(const std::string& text) {
  nlohmann::json doc;
  try {
    doc = meshsim::parse_json(text, "config.json");
  } catch (const meshsim::JsonError& e) {
    meshsim::fuzz::expect_one_line(e);
    return;
  }
  meshsim::TransformerShape shape; // the default tiny model, with its defaults resolved
  shape.ffn_hidden = 4 * shape.hidden;
  shape.kv_heads = shape.heads;
  for (const auto& family : meshsim::hf_families()) {
    try {
      family.check(meshsim::ConfigReader(doc, "config.json's"), shape);
    } catch (const meshsim::DataError& e) {
      meshsim::fuzz::expect_one_line(e);
    } catch (const std::invalid_argument& e) {
      meshsim::fuzz::expect_one_line(e);
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const std::string input = meshsim::fuzz::as_string(data + 1, size - 1);
  try {
    if (data[0] % 2 == 0)
      fuzz_safetensors_file(input);
    else
      fuzz_hf_config(input);
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
