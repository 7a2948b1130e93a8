// CRC-32C (Castagnoli): the checksum of TensorBoard's TFRecord frames and of checkpoint parts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshsim {

/// CRC-32C (Castagnoli), as TFRecord uses. crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
/// ((crc >> 15) | (crc << 17)) + 0xa282ead8, TFRecord's masking of stored CRCs.
uint32_t masked_crc32c(const void* data, size_t n);

} // namespace meshsim
