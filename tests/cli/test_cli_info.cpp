// `meshsim info`: NVML's lines, from a machine without a driver (MESHSIM_NVML_LIB at a
// missing file) and from tests/device/fake_nvml.c standing in for a driver with two cards.
#include <gtest/gtest.h>

#include <cstdlib>

#include "../device/fake_nvml.h"
#include "cli_harness.h"

using namespace meshsim::testing;

namespace {

/// `meshsim info` with MESHSIM_NVML_LIB set to `nvml_lib` for the child only.
CliResult info_with_nvml(const std::string& nvml_lib) {
  ::setenv("MESHSIM_NVML_LIB", nvml_lib.c_str(), 1);
  CliResult r = run_meshsim_exactly("info");
  ::unsetenv("MESHSIM_NVML_LIB");
  return r;
}

} // namespace

TEST(CliInfo, SaysWhyNvmlIsAbsent) {
  const auto r = info_with_nvml("/nonexistent");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("LibTorch "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nNVML not available: /nonexistent not found\n"), std::string::npos)
      << r.output;
}

TEST(CliInfo, ShowsEveryCardNvmlSees) {
  FakeNvml fake;
  if (!fake.lib)
    GTEST_SKIP() << "no C compiler to build the fake NVML";
  const auto r = info_with_nvml(fake.lib->string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\nNVML: driver 555.42.06, 2 devices\n"
                          "NVML device 0: Fake GPU 0, 1.50 GiB of 80.00 GiB used, utilisation 42%\n"
                          "NVML device 1: Fake GPU 1, 3.00 GiB of 80.00 GiB used, utilisation not "
                          "reported\n"),
            std::string::npos)
      << r.output;
}
