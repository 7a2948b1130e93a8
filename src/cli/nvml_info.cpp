// `meshsim info`, NVML's part: the driver and every card as NVML sees them, or why it cannot.
#include <fmt/format.h>

#include "cli/commands.h"
#include "device/nvml.h"
#include "memory/category.h"

namespace meshsim {

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

} // namespace meshsim
