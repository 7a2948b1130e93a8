// Fuzzes a checkpoint's manifest.json and the check of a part's bytes
// (train/checkpoint_manifest.h). The input is the manifest text, a NUL, then the bytes of a
// part; when the manifest parses, the bytes are checked against its first part.
// Correct behaviour: DataError, with a one-line message, is the only exception that may
// escape; anything else, a crash, a hang or undefined behaviour is a bug.
#include "data/dataset.h"
#include "fuzz_common.h"
#include "train/checkpoint_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = meshsim::fuzz::as_string(data, size);
  const size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  const std::string bytes = nul == std::string::npos ? std::string() : input.substr(nul + 1);
  try {
    const meshsim::CheckpointManifest m = meshsim::parse_manifest(text);
    if (m.parts.empty())
      std::abort(); // a manifest always lists at least one part
    meshsim::check_part_bytes(bytes, m.parts[0]);
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
