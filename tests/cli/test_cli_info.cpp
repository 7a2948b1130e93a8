// `meshsim info`: NVML's lines, from a machine without a driver (MESHSIM_NVML_LIB at a
// missing file) and from tests/device/fake_nvml.c standing in for a driver with two cards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

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

// The BLAS line names the library LibTorch's matrix products call and what it is. Debian's
// LibTorch takes the first libblas.so.3 on the library path, so each of Debian's that is
// installed here is put first in turn; PyPI's LibTorch holds MKL, whatever the path says.
TEST(CliInfo, NamesTheBlasItMultipliesWith) {
  const auto plain = run_meshsim_exactly("info");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_NE(plain.output.find("\nBLAS: "), std::string::npos) << plain.output;
  if (plain.output.find("\nBLAS: MKL (in LibTorch)\n") != std::string::npos)
    GTEST_SKIP() << "this LibTorch holds MKL: no libblas.so.3 to choose";
  const std::string lib = "/usr/lib/x86_64-linux-gnu/";
  const struct {
    std::string path; // LD_LIBRARY_PATH: the BLAS and the LAPACK built on it
    std::string says;
  } cases[] = {
      {lib + "blas:" + lib + "lapack", "(not OpenBLAS: "},
      {lib + "openblas-openmp", "threads from OpenMP, as many as ATen's"},
      {lib + "openblas-pthread", "threads of its own"},
  };
  int seen = 0;
  for (const auto& c : cases) {
    if (!std::filesystem::exists(c.path.substr(0, c.path.find(':')) + "/libblas.so.3"))
      continue; // that package is not installed here
    ::setenv("LD_LIBRARY_PATH", c.path.c_str(), 1);
    const auto r = run_meshsim_exactly("info");
    ::unsetenv("LD_LIBRARY_PATH");
    ++seen;
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.path << "\n" << r.output;
  }
  if (seen == 0)
    GTEST_SKIP() << "none of Debian's libblas.so.3 is installed in " << lib;
}
