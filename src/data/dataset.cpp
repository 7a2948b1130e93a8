// IDX reading (raw or gzip), Fashion-MNIST loading/normalization and synthetic data.
// The reader treats every file as hostile: it checks the header before trusting any size in it,
// and grows its buffer only as real bytes arrive, so garbage can neither crash nor balloon memory.
#include "data/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <zlib.h>

#include <fmt/format.h>

#include "base/input_file.h"
#include "base/printable.h"

namespace meshsim {

namespace fs = std::filesystem;

namespace {

// Far above any IDX set meshsim trains on (Fashion-MNIST train images: 47 MB); anything larger is
// a corrupt header, and rejecting it keeps size arithmetic far from overflow.
constexpr uint64_t kMaxDataBytes = uint64_t{1} << 31;
constexpr int kMaxDims = 4;
constexpr size_t kChunk = size_t{1} << 20;
constexpr uint8_t kTypeUnsignedByte = 0x08;

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
  throw DataError(what + ": " + problem);
}

std::string hex(uint64_t v, int width) {
  std::ostringstream os;
  os << "0x" << std::hex;
  os.fill('0');
  os.width(width);
  os << v;
  return os.str();
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// zlib reports a truncated gzip stream as Z_BUF_ERROR with a short (not failed) read, so the
// status must be checked after every read, not only when gzread returns -1.
void check_gz_status(gzFile f, const std::string& path) {
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  switch (err) {
  case Z_OK:
    return;
  case Z_BUF_ERROR:
    fail(path, "corrupt gzip: truncated stream (unexpected end of file)");
  case Z_ERRNO:
    fail(path, std::string("read error: ") + std::strerror(errno));
  case Z_MEM_ERROR:
    fail(path, "out of memory while decompressing");
  default:
    break;
  }
  // zlib prefixes its message with the path, which the caller's message already starts with.
  std::string text = msg ? msg : "unknown zlib error";
  if (text.rfind(path + ": ", 0) == 0)
    text.erase(0, path.size() + 2);
  fail(path, "corrupt gzip: " + text);
}

// Reads up to `want` bytes (fewer only at end of data).
size_t read_some(gzFile f, uint8_t* dst, size_t want, const std::string& path) {
  size_t got = 0;
  while (got < want) {
    const auto chunk = static_cast<unsigned>(std::min(want - got, kChunk));
    const int n = gzread(f, dst + got, chunk);
    check_gz_status(f, path);
    if (n <= 0)
      break;
    got += static_cast<size_t>(n);
  }
  return got;
}

std::string shape_str(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// Prefers the uncompressed file: it is what a user who unpacked the archive means to use.
std::string find_data_file(const fs::path& dir, const std::string& base) {
  std::error_code ec;
  const fs::path raw = dir / base;
  if (fs::is_regular_file(raw, ec))
    return raw.string();
  const fs::path gz = dir / (base + ".gz");
  if (fs::is_regular_file(gz, ec))
    return gz.string();
  fail(raw.string() + "[.gz]", "data file not found");
}

Dataset load_pair(const fs::path& dir, const std::string& images_base,
                  const std::string& labels_base) {
  const std::string images_path = find_data_file(dir, images_base);
  const std::string labels_path = find_data_file(dir, labels_base);
  const torch::Tensor images = read_idx(images_path);
  const torch::Tensor labels = read_idx(labels_path);
  if (images.dim() != 3 || images.size(1) != kImageSide || images.size(2) != kImageSide)
    fail(images_path, "expected [N,28,28] images, got " + shape_str(images));
  if (labels.dim() != 1)
    fail(labels_path, "expected [N] labels, got " + shape_str(labels));
  if (labels.size(0) != images.size(0))
    fail(labels_path, "label/image counts disagree: " + std::to_string(labels.size(0)) +
                          " labels but " + images_path + " has " + std::to_string(images.size(0)) +
                          " images");
  return make_dataset(images, labels, labels_path);
}

} // namespace

int64_t Dataset::size() const {
  return labels.defined() ? labels.size(0) : 0;
}

torch::Tensor read_idx(const std::string& path) {
  // Directories, FIFOs and devices could block or never end; only plain files are data.
  if (const std::string why = input_file_problem(path); !why.empty())
    fail(printable(path), why == "does not exist" ? "file not found" : "not a regular file: it " + why);
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f)
    fail(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(f.get(), 1 << 17);

  // gzread passes non-gzip files through unchanged, so one code path serves both formats.
  uint8_t head[4 + 4 * kMaxDims];
  size_t got = read_some(f.get(), head, 4, path);
  const std::string kind = gzdirect(f.get()) ? "file" : "decompressed data";
  if (got < 4)
    fail(path, "truncated file: " + kind + " has " + std::to_string(got) +
                   " bytes, too few for an IDX header");
  if (head[0] != 0 || head[1] != 0) {
    const uint64_t magic =
        (uint64_t{head[0]} << 24) | (uint64_t{head[1]} << 16) | (uint64_t{head[2]} << 8) | head[3];
    fail(path, "wrong magic number " + hex(magic, 8) + " (IDX files start with 00 00)");
  }
  if (head[2] != kTypeUnsignedByte)
    fail(path, "unsupported type code " + hex(head[2], 2) + " (only 0x08, unsigned byte)");
  const int ndims = head[3];
  if (ndims < 1 || ndims > kMaxDims)
    fail(path, "absurd dims: " + std::to_string(ndims) + " dimensions");
  got = read_some(f.get(), head + 4, 4 * static_cast<size_t>(ndims), path);
  if (got < 4 * static_cast<size_t>(ndims))
    fail(path, "truncated file: header ends inside the dimension sizes");

  std::vector<int64_t> dims;
  uint64_t total = 1;
  std::string dims_str;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = head + 4 + 4 * i;
    const uint64_t d =
        (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | p[3];
    dims_str += (i ? "x" : "") + std::to_string(d);
    total *= std::min(d, kMaxDataBytes + 1); // both factors <= 2^31+1: no overflow
    if (total > kMaxDataBytes)
      fail(path, "absurd dims " + dims_str + "... (over 2 GiB of data)");
    dims.push_back(static_cast<int64_t>(d));
  }

  // Read one byte past the expected end so that over-long files are caught too.
  std::vector<uint8_t> buf;
  buf.reserve(std::min<uint64_t>(total + 1, kChunk));
  while (buf.size() < total + 1) {
    const size_t old = buf.size();
    const size_t want = std::min<uint64_t>(kChunk, total + 1 - old);
    buf.resize(old + want);
    const size_t n = read_some(f.get(), buf.data() + old, want, path);
    buf.resize(old + n);
    if (n < want)
      break;
  }
  if (buf.size() < total)
    fail(path, "truncated file: dims " + dims_str + " need " + std::to_string(total) +
                   " data bytes, " + kind + " has " + std::to_string(buf.size()));
  if (buf.size() > total)
    fail(path, "trailing bytes: " + kind + " is longer than dims " + dims_str + " say");

  torch::Tensor out = torch::empty(dims, torch::kUInt8);
  if (total > 0)
    std::memcpy(out.data_ptr<uint8_t>(), buf.data(), total);
  return out;
}

Dataset make_dataset(const torch::Tensor& images_u8, const torch::Tensor& labels_u8,
                     const std::string& what) {
  if (images_u8.scalar_type() != torch::kUInt8 || images_u8.dim() != 3 ||
      images_u8.size(1) != kImageSide || images_u8.size(2) != kImageSide)
    fail(what, "expected uint8 [N,28,28] images, got " + shape_str(images_u8));
  if (labels_u8.dim() != 1 || labels_u8.size(0) != images_u8.size(0))
    fail(what, "label/image counts disagree: labels " + shape_str(labels_u8) + ", images " +
                   shape_str(images_u8));
  Dataset d;
  d.labels = labels_u8.to(torch::kLong).contiguous();
  if (d.labels.numel() > 0) {
    const int64_t lo = d.labels.min().item<int64_t>(), hi = d.labels.max().item<int64_t>();
    if (lo < 0 || hi >= kNumClasses)
      fail(what, "label " + std::to_string(lo < 0 ? lo : hi) + " outside 0..9");
  }
  d.images = images_u8.to(torch::kFloat32)
                 .div_(255.0)
                 .sub_(kFashionMnistMean)
                 .div_(kFashionMnistStd)
                 .unsqueeze(1)
                 .contiguous();
  return d;
}

DataSplit load_idx_dataset(const std::string& dir) {
  if (path_kind(dir) == PathKind::kNothing)
    throw DataError("data folder not found: " + printable(dir) +
                    " (install Debian's dataset-fashion-mnist or pass --data synthetic)");
  if (const std::string why = folder_problem(dir); !why.empty())
    throw DataError(fmt::format("data folder {}: {} (an IDX folder holds the four "
                                "*-idx?-ubyte[.gz] files)",
                                printable(dir), why));
  DataSplit s;
  s.train = load_pair(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte");
  s.test = load_pair(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte");
  return s;
}

DataSplit synthetic_dataset(int64_t train_size, int64_t test_size, uint64_t seed) {
  if (train_size < 0 || test_size < 0)
    throw DataError("synthetic data: negative size requested");
  // A private generator keeps the data independent of the global RNG and of other threads.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Upsampled 7x7 noise gives prototypes with blob-like, image-scale structure; the stretch
  // makes them mostly dark with bright shapes, roughly like Fashion-MNIST's pixel statistics.
  constexpr int64_t kShift = 3, kCanvas = kImageSide + 2 * kShift;
  namespace F = torch::nn::functional;
  const auto coarse = torch::rand({kNumClasses, 1, 7, 7}, gen, torch::kFloat32);
  const auto protos = F::interpolate(coarse, F::InterpolateFuncOptions()
                                                 .size(std::vector<int64_t>{kCanvas, kCanvas})
                                                 .mode(torch::kBilinear)
                                                 .align_corners(false))
                          .sub_(0.5)
                          .mul_(2.5)
                          .add_(0.3)
                          .clamp_(0, 1);
  // Every 28x28 window of each class's canvas: sample = window at a random offset, so classes
  // must be recognised up to translation (easy for a CNN, hard for pixel templates).
  constexpr int64_t kOffsets = (2 * kShift + 1) * (2 * kShift + 1);
  const auto windows = protos.unfold(2, kImageSide, 1)
                           .unfold(3, kImageSide, 1)
                           .reshape({kNumClasses * kOffsets, 1, kImageSide, kImageSide});
  // Contrast jitter and strong pixel noise (sigma 0.6 before clamping) keep it from being solved
  // in a handful of steps: the small CNN in tests/data reaches ~94% after 100 steps, ~98% at 200.
  auto make = [&](int64_t n) {
    Dataset d;
    d.labels = torch::randint(0, kNumClasses, {n}, gen, torch::kLong);
    const auto offset = torch::randint(0, kOffsets, {n}, gen, torch::kLong);
    const auto contrast = torch::rand({n, 1, 1, 1}, gen, torch::kFloat32).mul_(0.6).add_(0.7);
    const auto noise = torch::randn({n, 1, kImageSide, kImageSide}, gen, torch::kFloat32);
    const auto pixels = windows.index_select(0, d.labels * kOffsets + offset)
                            .mul_(contrast)
                            .add_(noise.mul_(0.6))
                            .clamp_(0, 1);
    d.images = pixels.sub_(kFashionMnistMean).div_(kFashionMnistStd).contiguous();
    return d;
  };
  DataSplit s;
  s.train = make(train_size);
  s.test = make(test_size);
  return s;
}

DataSplit synthetic_images(int64_t train_size, int64_t test_size, int64_t channels, int64_t side,
                           int64_t classes, uint64_t seed) {
  if (train_size < 0 || test_size < 0)
    throw DataError("synthetic images: negative size requested");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto make = [&](int64_t n) {
    Dataset d;
    d.labels = torch::randint(0, classes, {n}, gen, torch::kLong);
    d.images = torch::randn({n, channels, side, side}, gen, torch::kFloat32);
    return d;
  };
  DataSplit s;
  s.train = make(train_size);
  s.test = make(test_size);
  return s;
}

std::pair<torch::Tensor, torch::Tensor> gather_batch(const Dataset& d,
                                                     const std::vector<int64_t>& indices) {
  const auto idx = torch::tensor(indices, torch::kLong);
  return {d.images.index_select(0, idx), d.labels.index_select(0, idx)};
}

} // namespace meshsim
