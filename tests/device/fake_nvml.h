// Builds tests/device/fake_nvml.c into a shared library that MESHSIM_NVML_LIB (or an Nvml opened
// on its path) can load: the only way to run the "NVML available" path without a driver.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace meshsim::testing {

/// The fake library built with `defines` (e.g. "-DFAKE_NVML_INIT_FAILS") in a fresh folder,
/// removed with it; `lib` is empty when no C compiler (cc, gcc, clang) is found. Each build
/// has its own file name: the dynamic loader would hand back a library already loaded under
/// the same name.
struct FakeNvml {
  std::filesystem::path dir;
  std::optional<std::filesystem::path> lib;

  explicit FakeNvml(const std::string& defines = "") {
    static std::atomic<int> n{0};
    const std::string id = std::to_string(::getpid()) + "-" + std::to_string(n++);
    dir = std::filesystem::temp_directory_path() / ("meshsim-fake-nvml-" + id);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const auto path = dir / ("libfake-nvml-" + id + ".so");
    const std::string source = std::string(MESHSIM_SOURCE_DIR) + "/tests/device/fake_nvml.c";
    for (const char* cc : {"cc", "gcc", "clang"}) {
      const std::string cmd = std::string(cc) + " -shared -fPIC -O1 " + defines + " -o '" +
                              path.string() + "' '" + source + "' >/dev/null 2>&1";
      if (std::system(cmd.c_str()) == 0) {
        lib = path;
        break;
      }
    }
  }
  ~FakeNvml() {
    std::error_code ec; // a loaded library stays mapped after its file is gone
    std::filesystem::remove_all(dir, ec);
  }
};

} // namespace meshsim::testing
