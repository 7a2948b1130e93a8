// Integers read from JSON files meshsim did not write itself (config.json, records.json,
// checkpoint manifests). nlohmann's get<T> casts a float such as 1e300 (undefined) and wraps
// an integer too large for T; json_integer refuses both.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

namespace meshsim {

/// `v` as a T, if it is an integer (not a float, not another type) that T can hold.
template <typename T> std::optional<T> json_integer(const nlohmann::json& v) {
  using Limits = std::numeric_limits<T>;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(Limits::max()))
      return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if constexpr (Limits::is_signed) {
      if (i >= static_cast<int64_t>(Limits::min()) && i <= static_cast<int64_t>(Limits::max()))
        return static_cast<T>(i);
    } else if (i >= 0) {
      return static_cast<T>(i);
    }
  }
  return std::nullopt;
}

} // namespace meshsim
