// Fuzzes routing_from_csv (plan/moe_routing.h): a run folder's routing.csv, which
// `meshsim plan --moe-routing RUN_DIR` reads. The first byte chooses the plan's experts (1 to
// 256), the rest is the file. It must give shares (as many as the experts, each finite and
// non-negative, summing to 1) or DataError with a one-line message. Anything else escaping,
// a crash or undefined behaviour is a bug.
#include "base/errors.h"
#include "fuzz_common.h"
#include "plan/moe_routing.h"

#include <cmath>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const int64_t experts = int64_t{data[0]} + 1;
  try {
    const meshsim::PlannedRouting r =
        meshsim::routing_from_csv(meshsim::fuzz::as_string(data + 1, size - 1), "routing.csv",
                                  experts);
    double sum = 0;
    for (double s : r.shares) {
      if (!std::isfinite(s) || s < 0)
        std::abort();
      sum += s;
    }
    if (static_cast<int64_t>(r.shares.size()) != experts || std::abs(sum - 1) > 1e-9)
      std::abort();
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
