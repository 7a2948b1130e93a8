// What every fuzz target checks besides "no crash": a parser may refuse its input only with a
// one-line message, since meshsim prints errors as single lines (README, exit codes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace meshsim::fuzz {

inline void expect_one_line(const std::exception& e) {
  const std::string what = e.what();
  if (what.find_first_of("\n\r") != std::string::npos) {
    std::fprintf(stderr, "error message is not one line: %s\n", what.c_str());
    std::abort();
  }
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

} // namespace meshsim::fuzz
