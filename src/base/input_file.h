// Files read from outside: a data set, a config.json, a run folder's records. Each is opened
// once, refused in one line unless it is a regular file of a size the reader can hold, and
// read whole. Directories, devices (/dev/zero), FIFOs, sockets, dangling links and loops of
// links are named as what they are, never read.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "base/errors.h"

namespace meshsim {

/// The largest file of each kind meshsim reads whole.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;    // config.json, a checkpoint's manifest
constexpr int64_t kMaxRecordsBytes = int64_t{1024} << 20; // records.json, a run part
constexpr int64_t kMaxTextBytes = int64_t{256} << 20;     // a text data set (32 bytes a byte once windowed)

/// What `path` names, its links followed: nothing there (no link either), a regular file, a
/// folder, or anything else (a device, a FIFO, a dangling link, a loop of links, ...).
enum class PathKind { kNothing, kFile, kFolder, kOther };
PathKind path_kind(const std::string& path);

/// What a stat() mode names: "a file", "a folder", "a device", "a FIFO (named pipe)", ...
std::string kind_name(mode_t mode);

/// Why `path` is not a folder ("is a file", "does not exist", "is a device, not a file", ...),
/// or "" when it is one.
std::string folder_problem(const std::string& path);

/// Why `path` cannot be read as a regular file, as a phrase ("is a folder, not a file", "is a
/// dangling symbolic link", ...), or "" when it can be opened as one.
std::string input_file_problem(const std::string& path);

/// `path`'s whole content. Throws DataError "WHAT PATH: REASON" when it is not a regular file,
/// cannot be read, or holds more than `max_bytes` (checked before and while reading, so a file
/// that grows is refused too). `path` appears in the message through printable().
std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes);

} // namespace meshsim
