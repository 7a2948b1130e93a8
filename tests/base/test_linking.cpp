// How meshsim's programs bind the C++ library when LibTorch carries a copy of part of it.
// PyTorch 2.11's wheel exports its own, unversioned std::filesystem from libtorch.so and
// libtorch_cpu.so; a program that loads them before libstdc++.so.6 binds its calls there, and
// that remove_all jumps to address 0 (seen on a GPU machine: every test that deleted a folder
// crashed). meshsim's programs list libstdc++ first (CMakeLists.txt, MESHSIM_FIRST_LIBS).
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace {

TEST(Linking, StdFilesystemBindsToLibstdcxx) {
  // The address the program's own call would jump to, resolved as the loader bound it.
  std::uintmax_t (*remove_all)(const std::filesystem::path&) = &std::filesystem::remove_all;
  Dl_info where{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(remove_all), &where), 0);
  ASSERT_NE(where.dli_fname, nullptr);
  EXPECT_NE(std::string(where.dli_fname).find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all binds to " << where.dli_fname;
}

} // namespace
