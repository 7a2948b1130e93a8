// Text from outside (a flag, a config file, a checkpoint's manifest) as it may appear in a
// one-line error message.
#pragma once

#include <string>

namespace meshsim {

/// `text` with control characters written as \xNN, so an error message that quotes it stays
/// one line whatever the input held.
std::string printable(const std::string& text);

} // namespace meshsim
