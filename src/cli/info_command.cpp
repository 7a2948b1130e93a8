// `meshsim info`: this build's LibTorch, CUDA path and c10d backend, the card it sees, the
// BLAS its CPU matrix products call, and NVML's view of the driver and every card (or why it
// cannot).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.h"
#include "comm/c10d_backend.h"
#include "device/nvml.h"
#include "device/physical_device.h"
#include "memory/category.h"

namespace meshsim {
namespace {

// NVML's lines: the driver version and, per card, its name, memory used of total and
// utilisation; or the one-line reason NVML is not available.
void print_nvml_info() {
  Nvml& nvml = Nvml::instance();
  if (!nvml.available()) {
    fmt::print("{}\n", nvml.reason());
    return;
  }
  std::string error;
  const auto driver = nvml.driver_version(&error);
  const auto count = nvml.device_count(&error);
  if (!driver || !count) {
    fmt::print("NVML: {}\n", error);
    return;
  }
  fmt::print("NVML: driver {}, {} device{}\n", *driver, *count, *count == 1 ? "" : "s");
  for (int i = 0; i < *count; ++i) {
    const auto name = nvml.name(i, &error);
    const auto card = name ? nvml.sample(i, &error) : std::nullopt;
    if (!card) {
      fmt::print("NVML device {}: {}\n", i, error);
      continue;
    }
    fmt::print("NVML device {}: {}, {} of {} used, utilisation {}\n", i, *name,
               format_bytes(card->used_bytes), format_bytes(card->total_bytes),
               card->util_pct ? fmt::format("{}%", *card->util_pct) : "not reported");
  }
}

// The physical device: whether this build has the CUDA path, and the card it sees.
void print_cuda_info() {
  fmt::print("CUDA path: {}\n", cuda_built() ? "built" : "compiled out");
  const CudaStatus card = cuda_status();
  if (!card.usable) {
    fmt::print("GPU: none ({})\n", card.reason);
    return;
  }
  fmt::print("GPU: {} (compute capability {}.{}, {} multiprocessors), {} total, {} free\n",
             card.name, card.capability_major, card.capability_minor, card.multiprocessors,
             format_bytes(card.total_bytes), format_bytes(card.free_bytes));
}

// The BLAS behind CPU matrix products. PyPI's LibTorch holds MKL; Debian's calls whichever
// libblas.so.3 the system's alternatives point at, and its reference BLAS (what
// --no-install-recommends leaves) multiplies several times slower than OpenBLAS.
void print_blas_info() {
  if (at::hasMKL()) {
    fmt::print("BLAS: MKL (in LibTorch)\n");
    return;
  }
  // The library LibTorch's sgemm_ binds to, and OpenBLAS's own entry points in it.
  Dl_info where{};
  void* gemm = ::dlsym(RTLD_DEFAULT, "sgemm_");
  if (gemm == nullptr || ::dladdr(gemm, &where) == 0 || where.dli_fname == nullptr) {
    fmt::print("BLAS: none found (no sgemm_ in this process)\n");
    return;
  }
  std::error_code error;
  const auto real = std::filesystem::canonical(where.dli_fname, error);
  const std::string file = error ? where.dli_fname : real.string();
  std::string openblas; // OpenBLAS's configuration, or empty: another BLAS
  int mode = 0;          // openblas_get_parallel: 0 one thread, 1 its own threads, 2 OpenMP's
  if (void* library = ::dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
    using Config = char* (*)();
    using Parallel = int (*)();
    if (const auto config = reinterpret_cast<Config>(::dlsym(library, "openblas_get_config")))
      openblas = config();
    if (const auto parallel = reinterpret_cast<Parallel>(::dlsym(library, "openblas_get_parallel")))
      mode = parallel();
    ::dlclose(library);
  }
  if (openblas.empty()) {
    fmt::print("BLAS: {} (not OpenBLAS: Debian's reference BLAS multiplies several times slower; "
               "install libopenblas0-openmp)\n",
               file);
    return;
  }
  fmt::print("BLAS: {} ({}; {})\n", openblas, file,
             mode == 2   ? "threads from OpenMP, as many as ATen's"
             : mode == 1 ? "threads of its own, not ATen's count: libopenblas0-openmp follows it"
                         : "one thread");
}

} // namespace

int run_info() {
  fmt::print("meshsim 0.1.0\nLibTorch {}\n", TORCH_VERSION);
  print_cuda_info();
  fmt::print("c10d backend: {}\n", !c10d_available()      ? "none (LibTorch without distributed)"
                                    : c10d_nccl_available() ? "Gloo (cpu), NCCL (cuda)"
                                                            : "Gloo (cpu); no NCCL in this LibTorch");
  fmt::print("{}", at::get_parallel_info());
  print_blas_info();
  print_nvml_info();
  return kExitOk;
}

} // namespace meshsim
