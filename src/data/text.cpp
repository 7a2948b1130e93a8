// Text windows and synthetic token sequences. Both are built on the host (uncharged): a
// rank copies its batch onto its virtual GPU with gather_batch.
#include "data/text.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/input_file.h"
#include "memory/allocator.h"

namespace meshsim {
namespace {

// Windows [first, first + count) of `bytes`: window i starts at i * seq_len.
Dataset windows(const torch::Tensor& bytes, int64_t first, int64_t count, int64_t seq_len) {
  torch::Tensor starts = (torch::arange(first, first + count, torch::kLong) * seq_len).unsqueeze(1);
  torch::Tensor index = starts + torch::arange(seq_len, torch::kLong).unsqueeze(0); // [count, S]
  return Dataset{bytes.index({index}), bytes.index({index + 1})};
}

} // namespace

namespace {

void check_options(int64_t seq_len, double test_fraction) {
  if (seq_len < 1)
    throw std::invalid_argument("text data: seq_len must be at least 1");
  if (!(test_fraction >= 0 && test_fraction < 1))
    throw std::invalid_argument("text data: test fraction must be in [0, 1)");
}

} // namespace

DataSplit make_text_dataset(const std::string& path, int64_t seq_len, double test_fraction) {
  // Checked before the file is read: a bad flag is a usage error whatever the file holds.
  check_options(seq_len, test_fraction);
  const std::string raw = read_input_file(path, "text data", kMaxTextBytes);
  return text_dataset_from_bytes(raw, path, seq_len, test_fraction);
}

DataSplit text_dataset_from_bytes(const std::string& raw, const std::string& what, int64_t seq_len,
                                  double test_fraction) {
  check_options(seq_len, test_fraction);
  // Window i is bytes [i*S, i*S + S] (S+1 bytes: S inputs, each input's next byte as label).
  const int64_t size = static_cast<int64_t>(raw.size());
  const int64_t n = size > seq_len ? (size - 1) / seq_len : 0;
  // Unsigned: 2 * seq_len + 1 overflows int64 for a seq_len past 2^62.
  if (n < 2)
    throw DataError("text data: " + what + " has " + std::to_string(size) +
                    " bytes, need at least " +
                    std::to_string(2 * static_cast<uint64_t>(seq_len) + 1) + " for 2 windows of " +
                    std::to_string(seq_len));

  GpuGuard host(nullptr);
  torch::Tensor bytes = torch::empty({size}, torch::kLong);
  auto* out = bytes.data_ptr<int64_t>();
  for (int64_t i = 0; i < size; ++i)
    out[i] = static_cast<unsigned char>(raw[i]);
  int64_t test = static_cast<int64_t>(std::llround(static_cast<double>(n) * test_fraction));
  if (test_fraction > 0)
    test = std::min(std::max<int64_t>(test, 1), n - 1);
  return DataSplit{windows(bytes, 0, n - test, seq_len), windows(bytes, n - test, test, seq_len)};
}

DataSplit synthetic_text(int64_t train, int64_t test, int64_t seq_len, int64_t vocab,
                         uint64_t seed) {
  if (train < 0 || test < 0 || seq_len < 1 || vocab < 2)
    throw std::invalid_argument("synthetic text: need sizes >= 0, seq_len >= 1 and vocab >= 2");
  GpuGuard host(nullptr);
  // A private generator keeps the data independent of the global RNG and of other threads.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto make = [&](int64_t count) {
    torch::Tensor start = torch::randint(vocab, {count, 1}, gen, torch::kLong);
    torch::Tensor stride = torch::randint(1, 4, {count, 1}, gen, torch::kLong);
    torch::Tensor seq =
        (start + stride * torch::arange(seq_len + 1, torch::kLong)).remainder(vocab);
    return Dataset{seq.narrow(1, 0, seq_len).contiguous(), seq.narrow(1, 1, seq_len).contiguous()};
  };
  Dataset train_set = make(train);
  return DataSplit{train_set, make(test)};
}

} // namespace meshsim
