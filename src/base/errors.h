// The errors every layer may raise about what came from outside.
#pragma once

#include <stdexcept>

namespace meshsim {

/// A problem with an input file (data, a run folder's records or parts, a checkpoint): missing,
/// not a regular file, too large, or malformed. The message is one line that names the file.
/// The command line turns it into exit code 3.
class DataError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

} // namespace meshsim
