// Tests for data/dataset: the IDX reader against the real Fashion-MNIST files, every error case
// on hand-made broken files, a fuzz loop over random corruptions, and the synthetic data set.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include "data/dataset.h"

namespace fs = std::filesystem;
using meshsim::DataError;
using Bytes = std::vector<uint8_t>;

namespace {

const char* kRealDir = "/usr/share/datasets/fashion-mnist";

Bytes idx_bytes(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = 0x08) {
  Bytes b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8)
      b.push_back(static_cast<uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes gzip_bytes(const Bytes& in) {
  z_stream z{};
  // windowBits 15 + 16 asks deflate for a gzip wrapper rather than a zlib one.
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&z, in.size()) + 64);
  z.next_in = const_cast<Bytes::value_type*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

Bytes pattern(size_t n, uint8_t salt = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i)
    b[i] = static_cast<uint8_t>(i * 7 + salt);
  return b;
}

} // namespace

// Each test gets its own folder: ctest runs tests as parallel processes. (Outside the
// anonymous namespace: the tests derive from it.)
class IdxFiles : public ::testing::Test {
protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "meshsim-idx-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const Bytes& b) {
    const std::string p = (fs::path(dir_) / name).string();
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
    return p;
  }
  // The message of the DataError that `fn` throws ("" and a test failure if none).
  template <class Fn> std::string error_of(Fn fn) {
    try {
      fn();
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line";
      return e.what();
    }
    ADD_FAILURE() << "no DataError thrown";
    return "";
  }
  void expect_read_error(const std::string& path, const std::string& problem) {
    const std::string msg = error_of([&] { meshsim::read_idx(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << msg;
  }
  // Writes a complete, valid data folder with `n` train and test samples.
  void write_dataset(int n, bool gz) {
    auto put = [&](const std::string& name, const Bytes& b) {
      write(gz ? name + ".gz" : name, gz ? gzip_bytes(b) : b);
    };
    const auto u = static_cast<uint32_t>(n);
    Bytes labels(n);
    for (int i = 0; i < n; ++i)
      labels[i] = static_cast<uint8_t>(i % 10);
    put("train-images-idx3-ubyte", idx_bytes({u, 28, 28}, pattern(n * 784u)));
    put("train-labels-idx1-ubyte", idx_bytes({u}, labels));
    put("t10k-images-idx3-ubyte", idx_bytes({u, 28, 28}, pattern(n * 784u, 3)));
    put("t10k-labels-idx1-ubyte", idx_bytes({u}, labels));
  }
  std::string dir_;
};


TEST(IdxRealData, LoadsFashionMnistWithMatchingStatistics) {
  if (!fs::is_directory(kRealDir))
    GTEST_SKIP() << kRealDir << " missing (Debian package dataset-fashion-mnist not installed)";
  const meshsim::DataSplit s = meshsim::load_idx_dataset(kRealDir);
  ASSERT_EQ(s.train.size(), 60000);
  ASSERT_EQ(s.test.size(), 10000);
  EXPECT_EQ(s.train.images.sizes(), torch::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(s.test.images.sizes(), torch::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(s.train.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(s.train.labels.scalar_type(), torch::kLong);
  // Fashion-MNIST is balanced: 6000 train and 1000 test images per class, labels 0..9.
  EXPECT_TRUE(torch::equal(torch::bincount(s.train.labels), torch::full({10}, 6000, torch::kLong)));
  EXPECT_TRUE(torch::equal(torch::bincount(s.test.labels), torch::full({10}, 1000, torch::kLong)));
  // The normalization constants were derived from exactly this data.
  EXPECT_NEAR(s.train.images.mean().item<double>(), 0.0, 2e-3);
  EXPECT_NEAR(s.train.images.std().item<double>(), 1.0, 2e-3);
}

TEST_F(IdxFiles, RawAndGzipReadIdentically) {
  const Bytes data = pattern(2 * 28 * 28);
  const auto raw = meshsim::read_idx(write("a", idx_bytes({2, 28, 28}, data)));
  const auto gz = meshsim::read_idx(write("a.gz", gzip_bytes(idx_bytes({2, 28, 28}, data))));
  ASSERT_EQ(raw.sizes(), torch::IntArrayRef({2, 28, 28}));
  EXPECT_EQ(raw.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(raw, gz));
  EXPECT_EQ(raw[1][0][5].item<int>(), static_cast<uint8_t>((784 + 5) * 7));
  const auto labels = meshsim::read_idx(write("l", idx_bytes({3}, {7, 8, 9})));
  EXPECT_TRUE(torch::equal(labels, torch::tensor({7, 8, 9}, torch::kUInt8)));
}

TEST_F(IdxFiles, HeaderErrorsNameTheFile) {
  expect_read_error(write("short", {0, 0}), "truncated");
  expect_read_error(write("magic", {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 5}), "wrong magic");
  expect_read_error(write("type", idx_bytes({2}, pattern(8), 0x0D)), "unsupported type code");
  expect_read_error(write("ndims0", idx_bytes({}, {})), "absurd dims");
  expect_read_error(write("ndims9", {0, 0, 8, 9, 0, 0, 0, 1}), "absurd dims");
  expect_read_error(write("huge", idx_bytes({60000, 60000, 60000}, {1, 2})), "absurd dims");
  expect_read_error(write("cutdims", {0, 0, 8, 3, 0, 0, 0, 1}), "truncated");
}

TEST_F(IdxFiles, SizeMismatchesNameTheFile) {
  const Bytes good = idx_bytes({2, 28, 28}, pattern(2 * 784));
  expect_read_error(write("trunc", Bytes(good.begin(), good.end() - 1)), "truncated");
  expect_read_error(write("trunc.gz", gzip_bytes(Bytes(good.begin(), good.end() - 100))),
                    "truncated");
  Bytes longer = good;
  longer.push_back(0);
  expect_read_error(write("long", longer), "trailing bytes");
}

TEST_F(IdxFiles, BadGzipAndMissingFilesNameTheFile) {
  const Bytes gz = gzip_bytes(idx_bytes({2, 28, 28}, pattern(2 * 784)));
  expect_read_error(write("cut.gz", Bytes(gz.begin(), gz.begin() + gz.size() / 2)), "gzip");
  Bytes garbage = {0x1f, 0x8b};
  for (int i = 0; i < 200; ++i)
    garbage.push_back(static_cast<uint8_t>(i * 37 + 11));
  expect_read_error(write("garbage.gz", garbage), "corrupt gzip");
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 0xff; // inside the CRC32 trailer
  expect_read_error(write("crc.gz", bad_crc), "corrupt gzip");
  expect_read_error(dir_ + "/nope", "file not found");
  expect_read_error(dir_, "not a regular file");
}

TEST_F(IdxFiles, LoadsSmallDatasetPreferringRawOverGzip) {
  write_dataset(3, false);
  write_dataset(4, true);
  auto s = meshsim::load_idx_dataset(dir_);
  ASSERT_EQ(s.train.size(), 3); // the uncompressed files win when both exist
  EXPECT_EQ(s.test.images.sizes(), torch::IntArrayRef({3, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(s.train.labels, torch::tensor({0, 1, 2}, torch::kLong)));
  // pattern(...)[0] == 0 and [1] == 7: check the exact normalization formula.
  EXPECT_FLOAT_EQ(s.train.images[0][0][0][0].item<float>(), (0.0 - 0.2860) / 0.3530);
  EXPECT_FLOAT_EQ(s.train.images[0][0][0][1].item<float>(), (7.0 / 255 - 0.2860) / 0.3530);

  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
    fs::remove(fs::path(dir_) / f);
  s = meshsim::load_idx_dataset(dir_);
  EXPECT_EQ(s.train.size(), 4);
  EXPECT_EQ(s.test.size(), 4);
}

TEST_F(IdxFiles, DatasetErrorsNameTheFileOrFolder) {
  const std::string missing = dir_ + "/absent";
  std::string msg = error_of([&] { meshsim::load_idx_dataset(missing); });
  EXPECT_NE(msg.find("data folder not found: " + missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data synthetic"), std::string::npos) << msg;

  write_dataset(3, false);
  fs::remove(dir_ + "/t10k-labels-idx1-ubyte");
  msg = error_of([&] { meshsim::load_idx_dataset(dir_); });
  EXPECT_NE(msg.find("t10k-labels-idx1-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;

  write("t10k-labels-idx1-ubyte", idx_bytes({2}, {1, 2})); // 2 labels for 3 images
  msg = error_of([&] { meshsim::load_idx_dataset(dir_); });
  EXPECT_NE(msg.find("t10k-labels-idx1-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("counts disagree"), std::string::npos) << msg;

  write("t10k-labels-idx1-ubyte", idx_bytes({3}, {1, 2, 10}));
  msg = error_of([&] { meshsim::load_idx_dataset(dir_); });
  EXPECT_NE(msg.find("outside 0..9"), std::string::npos) << msg;

  write("t10k-labels-idx1-ubyte", idx_bytes({3}, {1, 2, 3}));
  write("train-images-idx3-ubyte", idx_bytes({3, 27, 28}, pattern(3 * 27 * 28)));
  msg = error_of([&] { meshsim::load_idx_dataset(dir_); });
  EXPECT_NE(msg.find("train-images-idx3-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[N,28,28]"), std::string::npos) << msg;
}

// Random truncations, bit flips, insertions and header scribbles, raw and gzip: the reader may
// succeed or throw DataError, but must never crash, hang, or throw anything else.
TEST_F(IdxFiles, FuzzedFilesOnlyEverThrowDataError) {
  std::mt19937 rng(20240601);
  auto rnd = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  int ok = 0, errors = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int ndims = 1 + static_cast<int>(rnd(3));
    std::vector<uint32_t> dims;
    size_t n = 1;
    for (int i = 0; i < ndims; ++i)
      n *= dims.emplace_back(static_cast<uint32_t>(rnd(6)));
    Bytes b = idx_bytes(dims, pattern(n, static_cast<uint8_t>(iter)));
    const bool gz = rnd(2) == 1;
    // gzip mode corrupts either the compressed stream or the payload before compression.
    const bool corrupt_stream = gz && rnd(2) == 1;
    if (corrupt_stream)
      b = gzip_bytes(b);
    auto byte = [&] { return static_cast<uint8_t>(rng()); };
    switch (rnd(4)) {
    case 0:
      b.resize(rnd(b.size() + 1));
      break;
    case 1:
      for (size_t k = 1 + rnd(4); k > 0 && !b.empty(); --k)
        b[rnd(b.size())] ^= 1u << rnd(8);
      break;
    case 2:
      for (size_t k = 1 + rnd(8); k > 0; --k)
        b.insert(b.begin() + rnd(b.size() + 1), byte());
      break;
    default:
      for (size_t k = 0; k < 4 && k < b.size(); ++k)
        b[rnd(std::min<size_t>(b.size(), 12))] = byte();
    }
    if (gz && !corrupt_stream)
      b = gzip_bytes(b);
    const std::string path = write("fuzz" + std::to_string(iter) + (gz ? ".gz" : ""), b);
    try {
      const auto t = meshsim::read_idx(path);
      EXPECT_EQ(t.scalar_type(), torch::kUInt8);
      ++ok;
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << ": non-DataError exception: " << e.what();
    }
  }
  // Both outcomes must occur, or the loop is not exercising what it claims to.
  EXPECT_GT(ok, 10);
  EXPECT_GT(errors, 100);
}

TEST(IdxSynthetic, DeterministicShapedAndSeedDependent) {
  const auto a = meshsim::synthetic_dataset(300, 50, 7);
  const auto b = meshsim::synthetic_dataset(300, 50, 7);
  const auto c = meshsim::synthetic_dataset(300, 50, 8);
  EXPECT_EQ(a.train.images.sizes(), torch::IntArrayRef({300, 1, 28, 28}));
  EXPECT_EQ(a.test.images.sizes(), torch::IntArrayRef({50, 1, 28, 28}));
  EXPECT_EQ(a.train.labels.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(a.train.images, b.train.images));
  EXPECT_TRUE(torch::equal(a.test.labels, b.test.labels));
  EXPECT_FALSE(torch::equal(a.train.images, c.train.images));
  EXPECT_FALSE(torch::equal(a.train.images.narrow(0, 0, 50), a.test.images));
  EXPECT_GE(a.train.labels.min().item<int64_t>(), 0);
  EXPECT_LE(a.train.labels.max().item<int64_t>(), 9);
  EXPECT_EQ(torch::bincount(a.train.labels).numel(), 10); // every class present
}

// The promise behind --data synthetic: a small CNN learns it within a few hundred steps.
TEST(IdxSynthetic, SmallCnnLearnsItQuickly) {
  torch::manual_seed(0);
  const auto data = meshsim::synthetic_dataset(4096, 1000, 1);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)), torch::nn::ReLU(),
                            torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                            torch::nn::Linear(8 * 12 * 12, 10));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int64_t batch = 32;
  for (int64_t step = 0; step < 200; ++step) {
    const int64_t start = (step * batch) % data.train.size();
    const auto x = data.train.images.narrow(0, start, batch);
    const auto y = data.train.labels.narrow(0, start, batch);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
  }
  torch::NoGradGuard no_grad;
  const auto pred = net->forward(data.test.images).argmax(1);
  const double acc = pred.eq(data.test.labels).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(acc, 0.9) << "test accuracy after 200 steps";
}

TEST(IdxGatherBatch, SelectsRowsInOrder) {
  const auto d = meshsim::synthetic_dataset(20, 0, 3);
  const auto [x, y] = meshsim::gather_batch(d.train, {5, 0, 19, 5});
  ASSERT_EQ(x.sizes(), torch::IntArrayRef({4, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(x[0], d.train.images[5]));
  EXPECT_TRUE(torch::equal(x[2], d.train.images[19]));
  EXPECT_TRUE(torch::equal(x[3], x[0]));
  EXPECT_EQ(y[1].item<int64_t>(), d.train.labels[0].item<int64_t>());
  EXPECT_EQ(meshsim::gather_batch(d.train, {}).first.size(0), 0);
}
