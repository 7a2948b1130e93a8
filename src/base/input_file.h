// Files read from outside: a data set, a config.json, a run folder's records. Each is opened
// once, refused in one line unless it is a regular file of a size the reader can hold, and
// read whole. Directories, devices (/dev/zero), FIFOs, sockets, dangling links and loops of
// links are named as what they are, never read.
#pragma once

#include <cstdint>
#include <string>

#include "base/errors.h"

namespace meshsim {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiBytes = int64_t{1} << 20;

/// The largest file of each kind meshsim reads whole.
constexpr int64_t kMaxConfigBytes = 16 * kMiBytes;    // config.json, a checkpoint's manifest
constexpr int64_t kMaxRecordsBytes = 1024 * kMiBytes; // records.json, a run part
constexpr int64_t kMaxTextBytes = 256 * kMiBytes;     // a text data set (32 bytes a byte once windowed)

/// What `path` names, its links followed: nothing there (no link either), a regular file, a
/// folder, or anything else (a device, a FIFO, a dangling link, a loop of links, ...).
enum class PathKind { kNothing, kFile, kFolder, kOther };
PathKind path_kind(const std::string& path);

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

/// Throws the DataError read_input_file would for a file another library reads (gzip, LibTorch).
void check_input_file(const std::string& path, const std::string& what, int64_t max_bytes);

/// "1.5 GiB", "12.0 MiB", "512 B": a size in a message.
std::string size_text(int64_t bytes);

} // namespace meshsim
