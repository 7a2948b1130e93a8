// Category names and byte-size formatting shared by memory accounting and the CLI.
#include "memory/category.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace meshsim {

const char* category_name(MemoryCategory c) {
  switch (c) {
  case MemoryCategory::Parameters: return "parameters";
  case MemoryCategory::Gradients: return "gradients";
  case MemoryCategory::Optimizer: return "optimizer";
  case MemoryCategory::Activations: return "activations";
  case MemoryCategory::Communication: return "communication";
  case MemoryCategory::Other: return "other";
  }
  return "other";
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::llabs(bytes) < 1024) return fmt::format("{} B", bytes);
  if (std::fabs(b) < 1024.0 * 1024) return fmt::format("{:.1f} KiB", b / 1024);
  if (std::fabs(b) < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", b / (1024 * 1024));
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (std::fabs(b) < kGiB * 1024) return fmt::format("{:.2f} GiB", b / kGiB);
  if (std::fabs(b) < kGiB * 1024 * 1024) return fmt::format("{:.2f} TiB", b / (kGiB * 1024));
  if (std::fabs(b) < kGiB * 1024 * 1024 * 1024)
    return fmt::format("{:.2f} PiB", b / (kGiB * 1024 * 1024));
  return fmt::format("{:.2f} EiB", b / (kGiB * 1024 * 1024 * 1024));
}

} // namespace meshsim
