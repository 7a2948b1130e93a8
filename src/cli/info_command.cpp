// `meshsim info`: this build's LibTorch, CUDA path and c10d backend, the card it sees, and
// NVML's view of the driver and every card (or why it cannot).
#include <ATen/Parallel.h>
#include <fmt/format.h>

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

} // namespace

int run_info() {
  fmt::print("meshsim 0.1.0\nLibTorch {}\n", TORCH_VERSION);
  print_cuda_info();
  fmt::print("c10d backend: {}\n", !c10d_available()      ? "none (LibTorch without distributed)"
                                    : c10d_nccl_available() ? "Gloo (cpu), NCCL (cuda)"
                                                            : "Gloo (cpu); no NCCL in this LibTorch");
  fmt::print("{}", at::get_parallel_info());
  print_nvml_info();
  return kExitOk;
}

} // namespace meshsim
