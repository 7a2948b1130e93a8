// Fuzzes parse_bytes (config/byte_size.h), the parser of --gpu-mem and config.json's "gpu_mem".
// Correct behaviour: a size of at least 1 byte, or std::invalid_argument with a one-line
// message. Anything else escaping, a crash or undefined behaviour is a bug.
#include "fuzz_common.h"
#include "config/byte_size.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (meshsim::parse_bytes(meshsim::fuzz::as_string(data, size)) < 1)
      std::abort();
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
