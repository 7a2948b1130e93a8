// Fuzzes parse_cluster_spec (cost/hardware.h), the parser of --cluster, --intra and --inter.
// The input is split at newlines or NULs into the spec and the two link overrides.
// Correct behaviour: a cluster of 1 to 100,000 GPUs, or std::invalid_argument with a one-line
// message. Anything else escaping, a crash or undefined behaviour is a bug.
#include "cost/hardware.h"
#include "fuzz_common.h"

#include <stdexcept>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < size; ++i) {
    if ((data[i] == '\n' || data[i] == '\0') && parts.size() < 3)
      parts.emplace_back();
    else
      parts.back() += static_cast<char>(data[i]);
  }
  parts.resize(3);
  try {
    const meshsim::ClusterSpec c = meshsim::parse_cluster_spec(parts[0], parts[1], parts[2]);
    if (c.world_size() < 1 || c.world_size() > 100000)
      std::abort();
    (void)c.to_string();
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
