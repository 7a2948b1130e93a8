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

/// Fsyncs the finished file `tmp`, renames it over `path` and fsyncs the directory.
/// Throws std::runtime_error (one line) on failure; `tmp` is removed then.
void commit_atomic_file(const std::filesystem::path& tmp, const std::filesystem::path& path);

} // namespace meshsim
