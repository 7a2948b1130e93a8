// read_input_file(): one open, one fstat, a bounded read.
#include "base/file_descriptor.h"
#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/bytes.h"
#include "base/printable.h"

namespace meshsim {
namespace {

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


[[noreturn]] void refuse(const std::string& what, const std::string& path, const std::string& why) {
  throw DataError(fmt::format("{} {}: {}", what, path.empty() ? "''" : printable(path), why));
}

// Opens `path` without blocking (a FIFO would wait for a writer) and says why it is not a
// regular file of at most max_bytes, or "" with its size in *size.
std::string open_checked(const std::string& path, const std::string& what, int64_t max_bytes,
                         FileDescriptor& f, int64_t* size) {
  if (path.empty()) return "is an empty path";
  if (path.find('\0') != std::string::npos) return "has a NUL byte in its path";
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f.fd < 0) return open_problem(path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return "is " + kind_name(st.st_mode) + ", not a file";
  *size = static_cast<int64_t>(st.st_size);
  if (*size > max_bytes)
    return fmt::format("is {}, more than the {} meshsim reads as a {}", format_bytes(*size),
                       format_bytes(max_bytes), what);
  return "";
}

} // namespace

std::string kind_name(mode_t mode) {
  if (S_ISREG(mode)) return "a file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "something else";
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
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return open_problem(path, errno);
  if (S_ISDIR(st.st_mode)) return "";
  if (S_ISREG(st.st_mode)) return "is a file";
  return "is " + kind_name(st.st_mode) + ", not a folder";
}

std::string input_file_problem(const std::string& path) {
  FileDescriptor f;
  int64_t size = 0;
  return open_checked(path, "file", INT64_MAX, f, &size);
}

std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  FileDescriptor f;
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
                                     format_bytes(max_bytes), what));
  }
  return out;
}

} // namespace meshsim
