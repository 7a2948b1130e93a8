// printable(): control characters and stray bytes as \xNN; valid UTF-8 kept as it is.
#include "base/printable.h"

#include <fmt/format.h>

namespace meshsim {
namespace {

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), or 0 when the byte there starts none.
size_t utf8_length(const std::string& text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = at(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf; // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else
    return 0;
  if (i + n > text.size() || at(i + 1) < lo || at(i + 1) > hi)
    return 0;
  for (size_t k = 2; k < n; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xbf)
      return 0;
  return n;
}

} // namespace

bool has_control_character(const std::string& text) {
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

std::string printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += text[i++];
      continue;
    }
    if (const size_t n = c >= 0x80 ? utf8_length(text, i) : 0; n > 0) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    out += fmt::format("\\x{:02x}", c);
    ++i;
  }
  return out;
}

std::string last_line(const std::string& text) {
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t newline = text.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return text.substr(begin, end + 1 - begin);
}

} // namespace meshsim
