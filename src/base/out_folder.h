// A folder a command will write into (`--out`), checked before any work starts: a run or a
// plan that would only fail at its end, after minutes of work, fails at once instead.
#pragma once

#include <string>

namespace meshsim {

/// Why meshsim cannot write into the folder `path` (made when missing), as a phrase: "is a
/// file, not a folder", "cannot be made: /x is a file", "cannot be written: /x is not writable
/// (Permission denied)", "cannot be written: /x is on a read-only file system"; "" when it can.
/// Whether the folder is empty is the caller's to decide.
std::string out_folder_problem(const std::string& path);

/// True when `path` is a folder that holds anything.
bool is_nonempty_folder(const std::string& path);

} // namespace meshsim
