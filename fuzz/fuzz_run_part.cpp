// Fuzzes parse_run_part (launch/run_parts.h): the part of a run of processes each rank writes
// (ranks/rank-R.json) and rank 0 reads back, merges and turns into memory.csv, records and a
// mixture of experts' routing.csv and summary. The first byte chooses the world (1 to 8), the
// rest is the file, read as rank 0's. A part that parses is merged and its routing written.
// Correct behaviour: std::exception with a one-line message (read_run_parts turns it into a
// DataError naming the file) is the only way out; a crash or undefined behaviour is a bug.
#include "fuzz_common.h"
#include "launch/run_parts.h"
#include "report/routing.h"

#include <exception>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const int world = data[0] % 8 + 1;
  try {
    std::vector<meshsim::RunPart> parts{
        meshsim::parse_run_part(meshsim::fuzz::as_string(data + 1, size - 1), 0, world)};
    const meshsim::MergedRun merged = meshsim::merge_run_parts(parts);
    if (!merged.routing.empty()) {
      (void)meshsim::routing_csv(merged.routing);
      (void)meshsim::routing_summary(merged.routing);
    }
  } catch (const std::exception& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
