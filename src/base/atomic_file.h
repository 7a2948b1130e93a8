// Atomic file replacement for everything meshsim writes into a run folder.
//
// A run folder is read while the run is still going (TensorBoard, a user tailing metrics, a
// crash halfway through a write), so each file is written to a temporary name in the same
// directory, fsynced, and renamed over the real name: a reader sees the old file or the new
// one, never a torn one.
#pragma once

#include <filesystem>
#include <string>

namespace meshsim {

/// Writes `contents` to "<path>.tmp-<pid>-<n>", fsyncs it, renames it over `path` and fsyncs
/// the directory. Throws std::runtime_error with a one-line message on failure (and removes
/// the temporary file).
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

/// A fresh temporary name next to `path`: "<path>.tmp-<pid>-<n>", unique within the process
/// and across processes. For files produced by another program (gnuplot's PNG).
std::filesystem::path atomic_temp_path(const std::filesystem::path& path);

/// Removes every temporary file write_file_atomic is writing at this moment. Async-signal-safe:
/// a handler of SIGINT or SIGTERM calls it before the process ends, so an interrupted write
/// leaves the target as it was and no "<path>.tmp-*" beside it.
void remove_temp_files_now();

/// Installs a handler of SIGINT and SIGTERM that calls remove_temp_files_now() and then ends
/// the process by the same signal, as it would have ended without the handler.
void remove_temp_files_on_signals();

/// Fsyncs the finished file `tmp`, renames it over `path` and fsyncs the directory.
/// Throws std::runtime_error (one line) on failure; `tmp` is removed then.
void commit_atomic_file(const std::filesystem::path& tmp, const std::filesystem::path& path);

} // namespace meshsim
