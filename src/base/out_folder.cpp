// out_folder_problem(): the folder itself, or the nearest part of its path that exists.
#include "base/out_folder.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "base/input_file.h"
#include "base/printable.h"

namespace fs = std::filesystem;

namespace meshsim {

std::string out_folder_problem(const std::string& path) {
  if (path.empty()) return "is an empty path";
  fs::path at = fs::path(path);
  struct stat st {};
  bool first = true;
  // The nearest existing part of the path: the folder itself, or where it would be made.
  while (::stat(at.c_str(), &st) != 0) {
    // ENOTDIR: a file stands where a folder of the path should; the walk up finds it.
    if (errno != ENOENT && errno != ENOTDIR)
      return fmt::format("cannot be reached: {}", std::strerror(errno));
    struct stat link {};
    if (first && ::lstat(at.c_str(), &link) == 0) return "is a dangling symbolic link";
    first = false;
    fs::path parent = at.parent_path();
    if (parent.empty()) parent = ".";
    if (parent == at) return "cannot be reached: its path does not exist";
    at = parent;
  }
  const std::string shown = printable(at.string());
  if (!S_ISDIR(st.st_mode)) {
    const std::string kind = kind_name(st.st_mode);
    return first ? fmt::format("is {}, not a folder", kind)
                 : fmt::format("cannot be made: {} is {}, not a folder", shown, kind);
  }
  if (::access(at.c_str(), W_OK | X_OK) != 0)
    return fmt::format("cannot be written: {} is not writable ({})", shown, std::strerror(errno));
  struct statvfs vfs {};
  if (::statvfs(at.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
    return fmt::format("cannot be written: {} is on a read-only file system", shown);
  return "";
}

bool is_nonempty_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::directory_iterator(path, ec) != fs::directory_iterator();
}

} // namespace meshsim
