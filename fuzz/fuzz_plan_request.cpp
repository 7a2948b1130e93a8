// Fuzzes parse_plan_request (serve/plan_request.h), the parser of `meshsim serve`'s
// POST /api/plan bodies.
// Correct behaviour: flags that are each "--name" or a plain value (letters, digits, '-', '.',
// '_': nothing a command line could read as something else), or RequestError with a 4xx
// status and a one-line message. Anything else escaping, a crash or undefined behaviour is a
// bug.
#include "fuzz_common.h"
#include "serve/plan_request.h"

#include <cctype>

namespace {

bool plain(const std::string& value) {
  if (value.empty())
    return false;
  for (char c : value)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_')
      return false;
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const meshsim::PlanRequest r =
        meshsim::parse_plan_request(meshsim::fuzz::as_string(data, size));
    for (const std::string& f : r.flags)
      if (!plain(f))
        std::abort();
    if (r.command_line().find('\n') != std::string::npos)
      std::abort();
  } catch (const meshsim::RequestError& e) {
    meshsim::fuzz::expect_one_line(e);
    if (e.status() < 400 || e.status() > 499)
      std::abort();
  }
  return 0;
}
