// Tests for src/mesh/nvml: NVML absent or broken is a one-line reason and never a failure; the
// "available" path runs against tests/device/fake_nvml.c (two cards, the second without a
// utilisation reading); a CPU mesh's memory samples carry no card reading.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "fake_nvml.h"
#include "device/nvml.h"
#include "mesh/device_mesh.h"

using namespace meshsim;
using meshsim::testing::FakeNvml;

namespace {

/// Sets (or, with nullptr, unsets) an environment variable for one test.
struct NvmlScopedEnv {
  std::string name, old;
  bool had;
  NvmlScopedEnv(const char* n, const char* value) : name(n) {
    const char* v = std::getenv(n);
    had = v != nullptr;
    if (had)
      old = v;
    value ? ::setenv(n, value, 1) : ::unsetenv(n);
  }
  ~NvmlScopedEnv() { had ? ::setenv(name.c_str(), old.c_str(), 1) : ::unsetenv(name.c_str()); }
};

} // namespace

TEST(Nvml, MissingLibraryIsOneLineReason) {
  Nvml nvml("/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(nvml.available());
  EXPECT_EQ(nvml.reason(), "NVML not available: /nonexistent/libnvidia-ml.so.1 not found");
  std::string error;
  EXPECT_FALSE(nvml.device_count(&error));
  EXPECT_EQ(error, nvml.reason());
  EXPECT_FALSE(nvml.driver_version());
  EXPECT_FALSE(nvml.name(0));
  EXPECT_FALSE(nvml.sample(0, &error));
  EXPECT_EQ(error, nvml.reason());
}

TEST(Nvml, NoDriverSaysSo) {
  Nvml nvml("libnvidia-ml.so.1");
  if (nvml.available())
    GTEST_SKIP() << "this machine has an NVIDIA driver";
  EXPECT_EQ(nvml.reason(), "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver)");
}

TEST(Nvml, DefaultLibraryFollowsEnvironment) {
  {
    NvmlScopedEnv env("MESHSIM_NVML_LIB", nullptr);
    EXPECT_EQ(Nvml::default_library(), "libnvidia-ml.so.1");
  }
  NvmlScopedEnv env("MESHSIM_NVML_LIB", "/nonexistent");
  EXPECT_EQ(Nvml::default_library(), "/nonexistent");
  EXPECT_EQ(Nvml(Nvml::default_library()).reason(), "NVML not available: /nonexistent not found");
}

TEST(Nvml, FileThatIsNotALibraryIsOneLineReason) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("meshsim-not-nvml-" + std::to_string(::getpid()) + ".so");
  std::ofstream(path) << "not a shared library\n";
  Nvml nvml(path.string());
  std::filesystem::remove(path);
  EXPECT_FALSE(nvml.available());
  EXPECT_EQ(nvml.reason().rfind("NVML not available: cannot load " + path.string() + ": ", 0), 0u)
      << nvml.reason();
  EXPECT_EQ(nvml.reason().find('\n'), std::string::npos);
}

TEST(Nvml, FakeLibraryReadsEveryCard) {
  FakeNvml fake;
  if (!fake.lib)
    GTEST_SKIP() << "no C compiler to build the fake NVML";
  Nvml nvml(fake.lib->string());
  ASSERT_TRUE(nvml.available()) << nvml.reason();
  EXPECT_EQ(nvml.reason(), "");
  EXPECT_EQ(nvml.device_count(), 2);
  EXPECT_EQ(nvml.driver_version(), "555.42.06");
  EXPECT_EQ(nvml.name(1), "Fake GPU 1");

  const auto card0 = nvml.sample(0);
  ASSERT_TRUE(card0);
  EXPECT_EQ(card0->used_bytes, 1536LL << 20);
  EXPECT_EQ(card0->total_bytes, 80LL << 30);
  EXPECT_EQ(card0->util_pct, 42);
  const auto card1 = nvml.sample(1);
  ASSERT_TRUE(card1);
  EXPECT_EQ(card1->used_bytes, 3072LL << 20);
  EXPECT_FALSE(card1->util_pct) << "NVML answered Not Supported";

  std::string error;
  EXPECT_FALSE(nvml.sample(2, &error));
  EXPECT_EQ(error, "nvmlDeviceGetHandleByIndex_v2: Invalid Argument");
  EXPECT_FALSE(nvml.name(-1, &error));
  EXPECT_EQ(error, "no NVML device -1");
}

TEST(Nvml, FakeLibrarySampledFromManyThreads) {
  FakeNvml fake;
  if (!fake.lib)
    GTEST_SKIP() << "no C compiler to build the fake NVML";
  Nvml nvml(fake.lib->string());
  ASSERT_TRUE(nvml.available()) << nvml.reason();
  std::vector<std::thread> threads;
  std::vector<int> good(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i)
        good[t] += nvml.sample(t % 2).has_value() && nvml.name(t % 2).has_value();
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(good, std::vector<int>(4, 200));
}

TEST(Nvml, InitFailureIsOneLineReason) {
  FakeNvml fake("-DFAKE_NVML_INIT_FAILS");
  if (!fake.lib)
    GTEST_SKIP() << "no C compiler to build the fake NVML";
  Nvml nvml(fake.lib->string());
  EXPECT_FALSE(nvml.available());
  EXPECT_EQ(nvml.reason(), "NVML not available: nvmlInit_v2: Driver Not Loaded");
}

TEST(Nvml, MissingEntryPointIsOneLineReason) {
  FakeNvml fake("-DFAKE_NVML_NO_UTILIZATION");
  if (!fake.lib)
    GTEST_SKIP() << "no C compiler to build the fake NVML";
  Nvml nvml(fake.lib->string());
  EXPECT_FALSE(nvml.available());
  EXPECT_EQ(nvml.reason(),
            "NVML not available: " + fake.lib->string() + " has no nvmlDeviceGetUtilizationRates");
}

TEST(NvmlCudaIndex, FollowsCudaVisibleDevices) {
  std::string why;
  EXPECT_EQ(nvml_index_of_cuda_device("cuda", nullptr, &why), 0);
  EXPECT_EQ(nvml_index_of_cuda_device("cuda:3", nullptr, &why), 3);
  EXPECT_EQ(nvml_index_of_cuda_device("cuda:0", "2", &why), 2);
  EXPECT_EQ(nvml_index_of_cuda_device("cuda:1", "5, 7", &why), 7);

  EXPECT_FALSE(nvml_index_of_cuda_device("cpu", nullptr, &why));
  EXPECT_EQ(why, "cpu is not a CUDA device");
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:x", nullptr, &why));
  EXPECT_EQ(why, "cannot read a device index in cuda:x");
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:", nullptr, &why));
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:99999", nullptr, &why));
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:2", "0,1", &why));
  EXPECT_EQ(why, "cuda:2 is not in CUDA_VISIBLE_DEVICES=0,1");
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:0", "GPU-8932f937-d72c", &why));
  EXPECT_EQ(why, "cannot tell which card cuda:0 is: CUDA_VISIBLE_DEVICES=GPU-8932f937-d72c names "
                 "it GPU-8932f937-d72c, not by index");
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:0", "", &why));
  EXPECT_EQ(why, "cuda:0 is not in CUDA_VISIBLE_DEVICES=");
  EXPECT_FALSE(nvml_index_of_cuda_device("cuda:1", "0,,1", &why));
  EXPECT_EQ(why, "cuda:1 is not in CUDA_VISIBLE_DEVICES=0,,1");
}

TEST(NvmlMemoryTimeline, CudaSamplesCarryTheCardReading) {
  FakeNvml fake;
  if (!fake.lib)
    GTEST_SKIP() << "no C compiler to build the fake NVML";
  Nvml nvml(fake.lib->string());
  ASSERT_TRUE(nvml.available()) << nvml.reason();
  NvmlScopedEnv visible("CUDA_VISIBLE_DEVICES", "1,0");
  MeshOptions options;
  options.world_size = 2;
  options.capacity_bytes = 64LL << 20;
  options.device = "cuda:1"; // CUDA's second device is NVML's card 0
  options.nvml = &nvml;
  std::optional<DeviceMesh> mesh;
  try {
    mesh.emplace(options);
  } catch (const std::exception& e) {
    GTEST_SKIP() << "this build cannot make a cuda:1 mesh: " << e.what();
  }
  mesh->sample_memory(0, "start");
  const auto samples = mesh->timeline().samples();
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].phys_used_bytes, 1536LL << 20);
  EXPECT_EQ(samples[0].phys_util_pct, 42);
}

TEST(NvmlMemoryTimeline, CpuSamplesCarryNoCardReading) {
  MeshOptions options;
  options.world_size = 2;
  options.capacity_bytes = 64LL << 20;
  DeviceMesh mesh(options);
  mesh.sample_memory(0, "start");
  const auto samples = mesh.timeline().samples();
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_FALSE(samples[0].phys_used_bytes);
  EXPECT_FALSE(samples[0].phys_util_pct);
}
