// Fuzzes the IDX reader (data/dataset.h): read_idx on a file holding the input, raw or gzip
// (the reader tells them apart by the gzip magic), then make_dataset on what it returns when
// the shape fits images [N,28,28] or labels [N]. read_idx takes a path, so the input goes to
// one in-memory file per process (memfd, opened by its /proc/self/fd path): no disk writes,
// and the reader takes the same zlib path as for real files.
// Correct behaviour: a tensor with the file's dims, or DataError with a one-line message.
// Anything else escaping, a crash, a hang, undefined behaviour or an allocation beyond the
// -rss_limit_mb of `make fuzz` is a bug.
#include "data/dataset.h"
#include "fuzz_common.h"

#include <sys/mman.h>
#include <unistd.h>

namespace {

struct MemFile {
  int fd = memfd_create("meshsim-fuzz-idx", 0);
  std::string path = "/proc/self/fd/" + std::to_string(fd);
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const MemFile file;
  if (file.fd < 0 || ftruncate(file.fd, 0) != 0 ||
      pwrite(file.fd, data, size, 0) != static_cast<ssize_t>(size))
    std::abort();
  try {
    const torch::Tensor t = meshsim::read_idx(file.path);
    if (t.scalar_type() != torch::kUInt8 || t.dim() < 1 || t.dim() > 4)
      std::abort();
    if (t.dim() == 3 && t.size(1) == meshsim::kImageSide && t.size(2) == meshsim::kImageSide)
      meshsim::make_dataset(t, torch::zeros({t.size(0)}, torch::kUInt8), "images");
    if (t.dim() == 1)
      meshsim::make_dataset(torch::zeros({t.size(0), 28, 28}, torch::kUInt8), t, "labels");
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
