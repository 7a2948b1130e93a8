// CRC-32C, table-driven (reflected polynomial 0x82F63B78).
#include "base/crc32c.h"

#include <array>

namespace meshsim {
namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
    table[i] = c;
  }
  return table;
}

} // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i)
    crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

} // namespace meshsim
