// format_bytes(): binary units, one decimal up to MiB, two from GiB on.
#include "base/bytes.h"

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace meshsim {

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
