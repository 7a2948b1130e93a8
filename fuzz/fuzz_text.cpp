// Fuzzes the byte-level text data (data/text.h): text_dataset_from_bytes, which
// make_text_dataset calls on the file's contents. The first byte picks seq_len (small values,
// or with 0xff the next 8 bytes as a raw int64, so negative and huge ones come up too), the
// second the test fraction (k/200, NaN or negative at the ends); the rest is the text.
// Correct behaviour: two splits of windows of seq_len tokens, or DataError (too short) or
// std::invalid_argument (bad seq_len or fraction) with a one-line message. Anything else
// escaping, a crash or undefined behaviour is a bug.
#include "data/text.h"
#include "fuzz_common.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2)
    return 0;
  int64_t seq_len = static_cast<int64_t>(data[0]) - 8; // -8 .. 246
  size_t used = 2;
  if (data[0] == 0xff && size >= 10) {
    std::memcpy(&seq_len, data + 2, sizeof seq_len);
    used = 10;
  }
  double fraction = data[1] / 200.0;
  if (data[1] == 0xff)
    fraction = std::numeric_limits<double>::quiet_NaN();
  if (data[1] == 0xfe)
    fraction = -0.5;
  const std::string text = meshsim::fuzz::as_string(data + used, size - used);
  try {
    const meshsim::DataSplit s = meshsim::text_dataset_from_bytes(text, "input", seq_len, fraction);
    if (s.train.size() < 1 || s.train.images.size(1) != seq_len ||
        !s.train.labels.sizes().equals(s.train.images.sizes()))
      std::abort();
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
