// Text from outside (a flag, a config file, a checkpoint's manifest, a parser's message about
// them) as it may appear in a one-line error message.
#pragma once

#include <string>

namespace meshsim {

/// `text` with control characters (NUL included) and bytes that are not valid UTF-8 written as
/// \xNN, so an error message that quotes it stays one printable line whatever the input held.
std::string printable(const std::string& text);

/// True when `text` holds a control character (NUL included): a value that an error message
/// could quote only escaped, and that a C string would cut.
bool has_control_character(const std::string& text);

/// The last line of `text` that is not blank, without the whitespace that ends it: what a
/// child process said last on its stderr.
std::string last_line(const std::string& text);

} // namespace meshsim
