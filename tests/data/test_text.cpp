// Tests for data/text: byte windows and their next-byte labels on a hand-made file, the split
// sizes, one-line errors, and the synthetic token sequences.
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/text.h"

namespace fs = std::filesystem;
using namespace meshsim;

namespace {

std::string write_file(const std::string& name, const std::string& bytes) {
  const fs::path path =
      fs::temp_directory_path() / ("meshsim_text_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

std::string error_of(const std::string& path, int64_t seq_len) {
  try {
    make_text_dataset(path, seq_len);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(TextData, WindowsAreShiftedByOneAndSplitAtTheEnd) {
  // 41 bytes 0..40, seq_len 4: windows start at 0, 4, ..., 36 -> (41-1)/4 = 10 windows.
  std::string bytes;
  for (int i = 0; i <= 40; ++i)
    bytes.push_back(static_cast<char>(i + 200)); // bytes > 127 stay unsigned
  const auto path = write_file("windows", bytes);
  const DataSplit split = make_text_dataset(path, 4, 0.2);
  EXPECT_EQ(split.train.size(), 8);
  EXPECT_EQ(split.test.size(), 2);
  EXPECT_EQ(split.train.images.sizes(), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(split.train.images.scalar_type(), torch::kLong);
  EXPECT_EQ(split.train.labels.scalar_type(), torch::kLong);
  for (int64_t w = 0; w < 8; ++w)
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(split.train.images[w][i].item<int64_t>(), 200 + 4 * w + i);
      EXPECT_EQ(split.train.labels[w][i].item<int64_t>(), 200 + 4 * w + i + 1);
    }
  // The test split is the file's last windows: 32..35 -> 33..36 and 36..39 -> 37..40.
  EXPECT_EQ(split.test.images[0][0].item<int64_t>(), 232);
  EXPECT_EQ(split.test.labels[1][3].item<int64_t>(), 240);
  // Any positive fraction leaves at least one window on each side.
  EXPECT_EQ(make_text_dataset(path, 4, 0.01).test.size(), 1);
  EXPECT_EQ(make_text_dataset(path, 4, 0.0).train.size(), 10);
  fs::remove(path);
}

TEST(TextData, OneLineErrorsForMissingAndShortFiles) {
  const std::string missing = error_of("/nonexistent/meshsim.txt", 8);
  EXPECT_NE(missing.find("text data /nonexistent/meshsim.txt: does not exist"), std::string::npos)
      << missing;
  const auto path = write_file("short", std::string(16, 'a')); // 2 windows of 8 need 17 bytes
  const std::string shortfile = error_of(path, 8);
  EXPECT_NE(shortfile.find("has 16 bytes, need at least 17"), std::string::npos) << shortfile;
  EXPECT_EQ(shortfile.find('\n'), std::string::npos);
  EXPECT_EQ(make_text_dataset(write_file("short", std::string(17, 'a')), 8).train.size(), 1);
  EXPECT_THROW(make_text_dataset(path, 0), std::invalid_argument);
  EXPECT_THROW(make_text_dataset(path, 4, 1.0), std::invalid_argument);
  fs::remove(path);
}

// The "need at least 2 * seq_len + 1 bytes" message overflowed int64 (undefined; fuzz/fuzz_text
// runs under UBSan and has this input in its corpus) for a seq_len past 2^62.
TEST(TextData, HugeSeqLenIsADataErrorWithoutOverflow) {
  const int64_t huge = (int64_t{1} << 62) + 3;
  try {
    text_dataset_from_bytes("some text", "input", huge);
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("need at least 9223372036854775815"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(text_dataset_from_bytes(std::string(17, 'a'), "input", 8).train.size(), 1);
  EXPECT_THROW(text_dataset_from_bytes("abc", "input", 0), std::invalid_argument);
}

TEST(TextData, SyntheticTextIsDeterministicAndShifted) {
  const DataSplit a = synthetic_text(16, 4, 12, 50, 9), b = synthetic_text(16, 4, 12, 50, 9);
  EXPECT_TRUE(torch::equal(a.train.images, b.train.images));
  EXPECT_TRUE(torch::equal(a.test.labels, b.test.labels));
  EXPECT_EQ(a.train.images.sizes(), (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(a.test.size(), 4);
  EXPECT_LT(a.train.images.max().item<int64_t>(), 50);
  EXPECT_GE(a.train.images.min().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(a.train.images.narrow(1, 1, 11), a.train.labels.narrow(1, 0, 11)));
  EXPECT_FALSE(torch::equal(a.train.images, synthetic_text(16, 4, 12, 50, 10).train.images));
}
