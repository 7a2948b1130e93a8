// Sizes written as text, as --gpu-mem and a config file's "gpu_mem" give them.
#pragma once

#include <cstdint>
#include <string>

namespace meshsim {

/// Parses "512MiB", "2GiB", "1.5GB", "4096" (bytes). Throws std::invalid_argument with a
/// one-line message that quotes the text.
int64_t parse_bytes(const std::string& text);

} // namespace meshsim
