// printable(): control characters as \xNN.
#include "report/printable.h"

#include <fmt/format.h>

namespace meshsim {

std::string printable(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += ch;
  }
  return out;
}

} // namespace meshsim
