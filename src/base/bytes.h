// Byte counts as a person reads them, in every layer's messages.
#pragma once

#include <cstdint>
#include <string>

namespace meshsim {

/// "12.4 MiB", "512 B", "1.00 EiB": human-readable byte counts for logs and errors.
std::string format_bytes(int64_t bytes);

} // namespace meshsim
