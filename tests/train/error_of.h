// The one-line message of the std::invalid_argument a call throws, for tests of refusals.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace meshsim::testing {

/// The message of the std::invalid_argument that `fn` throws, checked to be one line; "" (and
/// a test failure) if it throws none.
template <typename Fn> std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument thrown";
  return "";
}

} // namespace meshsim::testing
