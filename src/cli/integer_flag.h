// An integer flag, checked on its text before CLI11 converts it. CLI11 alone reads "0x10" as
// hex and "010" as octal, and turns 2^63 into 2^63 - 1 without a word (strtoll clamps); a value
// that does not fit the field's own type would be cut. Every integer flag of every command is
// added through add_integer_flag, so an error names the value exactly as it was typed.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/printable.h"

namespace meshsim {

/// A whole decimal number from `min` to T's largest, or the error CLI11 prints after the flag.
template <typename T> CLI::Validator integer_text(long double min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        using Limits = std::numeric_limits<T>;
        const std::string range =
            fmt::format("a whole number from {:.0Lf} to {}", min, Limits::max());
        const bool negative = !text.empty() && text[0] == '-';
        const size_t first = negative ? 1 : 0;
        if (text.size() == first || text.find_first_not_of("0123456789", first) != std::string::npos)
          return fmt::format("must be {}, got '{}'", range, printable(text));
        errno = 0;
        char* end = nullptr;
        // Both ends checked in the widest type: an unsigned field still refuses "-1".
        const long double v = negative ? static_cast<long double>(std::strtoll(text.c_str(), &end, 10))
                                       : static_cast<long double>(std::strtoull(text.c_str(), &end, 10));
        if (errno == ERANGE || v > static_cast<long double>(Limits::max()))
          return fmt::format("must be {}, got '{}'", range, text);
        if (v < min) return fmt::format("must be at least {:.0Lf}, got {}", min, text);
        return "";
      },
      min > 0 ? "POSITIVE" : min == 0 ? "NON-NEGATIVE" : "");
}

/// `--name` bound to `field`; its text checked by integer_text (at least `min`, which defaults
/// to the type's own least value: the range is then checked by validation, which says why).
template <typename T>
CLI::Option* add_integer_flag(CLI::App& app, const std::string& name, T& field,
                              const std::string& description,
                              long double min = static_cast<long double>(std::numeric_limits<T>::min())) {
  return app.add_option(name, field, description)->check(integer_text<T>(min));
}

} // namespace meshsim
