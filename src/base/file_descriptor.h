// A POSIX file descriptor closed on every way out of the scope that opened it.
#pragma once

#include <unistd.h>

namespace meshsim {

struct FileDescriptor {
  int fd = -1;
  FileDescriptor() = default;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

} // namespace meshsim
