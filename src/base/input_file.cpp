// read_input_file(): one open, one fstat, a bounded read.
#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/printable.h"

namespace meshsim {
namespace {

// Closes the descriptor on every way out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string open_problem(const std::string& path, int err) {
  if (err == ENOENT) {
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      return "is a dangling symbolic link (its target does not exist)";
    return "does not exist";
  }
  if (err == ELOOP) return "is a loop of symbolic links";
  if (err == EACCES) return "cannot be read: permission denied";
  if (err == ENAMETOOLONG) return "is a path too long for this system";
  if (err == ENOTDIR) return "has a file where a folder should be in its path";
  return fmt::format("cannot be opened: {}", std::strerror(err));
}

std::string kind_problem(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a folder, not a file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, not a file";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO (named pipe), not a file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, not a file";
  return "is not a regular file";
}

[[noreturn]] void refuse(const std::string& what, const std::string& path, const std::string& why) {
  throw DataError(fmt::format("{} {}: {}", what, path.empty() ? "''" : printable(path), why));
}

// Opens `path` without blocking (a FIFO would wait for a writer) and says why it is not a
// regular file of at most max_bytes, or "" with its size in *size.
std::string open_checked(const std::string& path, const std::string& what, int64_t max_bytes,
                         Fd& f, int64_t* size) {
  if (path.empty()) return "is an empty path";
  if (path.find('\0') != std::string::npos) return "has a NUL byte in its path";
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f.fd < 0) return open_problem(path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  if (std::string kind = kind_problem(st); !kind.empty()) return kind;
  *size = static_cast<int64_t>(st.st_size);
  if (*size > max_bytes)
    return fmt::format("is {}, more than the {} meshsim reads as a {}", size_text(*size),
                       size_text(max_bytes), what);
  return "";
}

} // namespace

std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
  if (bytes >= kMiBytes) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / kMiBytes);
  if (bytes >= kKiB) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / kKiB);
  return fmt::format("{} B", bytes);
}

PathKind path_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0)
    return S_ISREG(st.st_mode) ? PathKind::kFile
           : S_ISDIR(st.st_mode) ? PathKind::kFolder
                                 : PathKind::kOther;
  struct stat link {};
  return errno == ENOENT && ::lstat(path.c_str(), &link) != 0 ? PathKind::kNothing : PathKind::kOther;
}

std::string folder_problem(const std::string& path) {
  switch (path_kind(path)) {
  case PathKind::kFolder: return "";
  case PathKind::kFile: return "is a file";
  default: {
    std::string why = input_file_problem(path);
    if (const size_t at = why.rfind(", not a file"); at != std::string::npos)
      why.replace(at, std::string::npos, ", not a folder");
    return why;
  }
  }
}

std::string input_file_problem(const std::string& path) {
  Fd f;
  int64_t size = 0;
  return open_checked(path, "file", INT64_MAX, f, &size);
}

void check_input_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  Fd f;
  int64_t size = 0;
  if (const std::string why = open_checked(path, what, max_bytes, f, &size); !why.empty())
    refuse(what, path, why);
}

std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  Fd f;
  int64_t size = 0;
  if (const std::string why = open_checked(path, what, max_bytes, f, &size); !why.empty())
    refuse(what, path, why);
  std::string out;
  out.reserve(static_cast<size_t>(size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      refuse(what, path, fmt::format("cannot be read: {}", std::strerror(errno)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes)
      refuse(what, path, fmt::format("grew past the {} meshsim reads as a {} while it was read",
                                     size_text(max_bytes), what));
  }
  return out;
}

} // namespace meshsim
