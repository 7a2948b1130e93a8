#include "config/byte_size.h"

#include <cctype>
#include <stdexcept>

#include "base/printable.h"

namespace meshsim {

int64_t parse_bytes(const std::string& text) {
  const std::string shown = "'" + printable(text) + "'";
  const std::string expected = "expected a size such as 512MiB or 2GiB, got " + shown;
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0)
    throw std::invalid_argument(expected);
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(text.substr(0, i), &used);
  } catch (const std::exception&) {
    throw std::invalid_argument(expected);
  }
  // stod stops at a second '.', so "1.2.3" would otherwise pass as 1.2.
  if (used != i)
    throw std::invalid_argument(expected);
  std::string unit = text.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "kib" || unit == "k") scale = 1024.0;
  else if (unit == "mib" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else
    throw std::invalid_argument("unknown size unit '" + printable(text.substr(i)) + "' in " +
                                shown + " (use B, KiB, MiB, GiB, KB, MB or GB)");
  const double bytes = value * scale;
  if (!(bytes >= 1) || bytes > 9.0e18)
    throw std::invalid_argument("size out of range: " + shown);
  return static_cast<int64_t>(bytes);
}

} // namespace meshsim
