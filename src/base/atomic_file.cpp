// write_file_atomic and friends: temp file + fsync + rename + directory fsync (POSIX).
#include "base/atomic_file.h"
#include "base/file_descriptor.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace meshsim {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int err) {
  throw std::runtime_error(what + " " + path.string() + ": " + std::strerror(err));
}

// The temporary files being written now, for remove_temp_files_now(), which a signal handler
// calls: fixed slots and atomics only, no allocation and no lock. A slot is free (0), being
// filled (1) or holds a path (2). More files at once than slots are written unregistered.
constexpr int kTempSlots = 64;
constexpr size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0};
  char path[kTempPathMax];
};
TempSlot g_temp_slots[kTempSlots];

int register_temp(const std::filesystem::path& tmp) {
  const std::string& s = tmp.native();
  if (s.size() >= kTempPathMax) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (g_temp_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_temp_slots[i].path, s.c_str(), s.size() + 1);
      g_temp_slots[i].state.store(2);
      return i;
    }
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot >= 0) g_temp_slots[slot].state.store(0);
}

// Unregisters the slot when the write is over, whichever way it ended.
struct TempRegistration {
  int slot;
  explicit TempRegistration(const std::filesystem::path& tmp) : slot(register_temp(tmp)) {}
  ~TempRegistration() { unregister_temp(slot); }
  TempRegistration(const TempRegistration&) = delete;
  TempRegistration& operator=(const TempRegistration&) = delete;
};

void write_all(int fd, const char* data, size_t n, const std::filesystem::path& path) {
  while (n > 0) {
    const ssize_t written = ::write(fd, data, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path, errno);
    }
    data += written;
    n -= static_cast<size_t>(written);
  }
}

void fsync_path(const std::filesystem::path& path, int flags) {
  FileDescriptor f;
  f.fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (f.fd < 0) fail("cannot open", path, errno);
  if (::fsync(f.fd) != 0) fail("cannot fsync", path, errno);
}

std::filesystem::path parent_or_dot(const std::filesystem::path& path) {
  const auto parent = path.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

/// Renames `tmp` over `path` (removing `tmp` if that fails), then fsyncs the directory:
/// without that a crash can lose the rename even though the data is on disk.
void rename_and_sync_dir(const std::filesystem::path& tmp, const std::filesystem::path& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename into", path, err);
  }
  FileDescriptor dir;
  dir.fd = ::open(parent_or_dot(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // Some file systems refuse fsync on a directory (EINVAL); the rename has happened anyway.
  if (dir.fd >= 0 && ::fsync(dir.fd) != 0 && errno != EINVAL && errno != EROFS) {
    fail("cannot fsync directory of", path, errno);
  }
}

} // namespace

std::filesystem::path atomic_temp_path(const std::filesystem::path& path) {
  static std::atomic<uint64_t> counter{0};
  return path.string() + ".tmp-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

void commit_atomic_file(const std::filesystem::path& tmp, const std::filesystem::path& path) {
  try {
    fsync_path(tmp, O_RDONLY);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  rename_and_sync_dir(tmp, path);
}

void remove_temp_files_now() {
  for (TempSlot& slot : g_temp_slots)
    if (slot.state.load() == 2) ::unlink(slot.path);
}

extern "C" void meshsim_remove_temp_files_and_die(int sig) {
  remove_temp_files_now();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void remove_temp_files_on_signals() {
  std::signal(SIGINT, meshsim_remove_temp_files_and_die);
  std::signal(SIGTERM, meshsim_remove_temp_files_and_die);
}

void write_file_atomic(const std::filesystem::path& path, const std::string& contents) {
  const auto tmp = atomic_temp_path(path);
  const TempRegistration registration(tmp);
  {
    FileDescriptor f;
    // O_EXCL: never write through a stale temp file or a symlink someone planted.
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f.fd < 0) fail("cannot create", tmp, errno);
    try {
      write_all(f.fd, contents.data(), contents.size(), tmp);
      if (::fsync(f.fd) != 0) fail("cannot fsync", tmp, errno);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  rename_and_sync_dir(tmp, path);
}

} // namespace meshsim
