// safetensors, Hugging Face's file of named tensors, read and written without Python: an
// 8-byte little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {text: text}}, then the tensors' raw
// little-endian bytes, the offsets counted from the end of the header. The reader checks what
// the reference implementation checks (the header's size and shape, every tensor's byte count
// against its dtype and shape, offsets that tile the data without a hole or an overlap), so a
// damaged file is one line, never a read out of bounds. Tensors are bytes here: this layer
// knows no torch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshsim {

/// The largest header a reader accepts (the reference implementation's limit, 100 MB).
constexpr int64_t kMaxSafetensorsHeader = 100'000'000;
/// The largest file read whole: weights far beyond any model this machine trains.
constexpr int64_t kMaxSafetensorsBytes = int64_t{1} << 42;

/// Bytes of one element of a safetensors dtype ("F32" → 4), or 0 for a name it does not have.
int64_t safetensors_dtype_size(const std::string& dtype);

struct SafetensorsInfo {
  std::string name;
  std::string dtype;          // "F32", "BF16", "I64", ...
  std::vector<int64_t> shape; // [] is a scalar
  int64_t begin = 0, end = 0; // data_offsets, from the start of the data
};

struct SafetensorsHeader {
  std::vector<SafetensorsInfo> tensors;        // in the order of their data
  std::map<std::string, std::string> metadata; // "__metadata__"
  int64_t data_start = 0;                      // 8 + the header's length
};

/// The header of a safetensors file of `file_size` bytes whose first bytes are `prefix` (at
/// least 8, and the whole header when the length they give fits in the file). Throws
/// DataError (one line, no path: the caller names the file) for anything malformed.
SafetensorsHeader parse_safetensors_header(const std::string& prefix, int64_t file_size);

/// The header of the file at `path`, reading only its first 8 + N bytes. Throws DataError
/// "PATH: REASON" (not a regular file, unreadable, malformed).
SafetensorsHeader read_safetensors_header(const std::string& path);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data; // the raw little-endian bytes, product(shape) × dtype size of them
};

/// A whole file: its header and each tensor's bytes, in data order. Throws DataError
/// "PATH: REASON".
struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;
};
SafetensorsFile read_safetensors(const std::string& path);
/// The same, from a file's bytes (the fuzz target's entry). Throws DataError "REASON".
SafetensorsFile parse_safetensors(const std::string& bytes);

/// The file's bytes: "__metadata__" first, then the tensors in the order given, their data in
/// that order, the header padded with spaces so the data starts 8-byte aligned (as the
/// reference writer does). The same tensors give the same bytes. Throws std::invalid_argument
/// for a tensor whose bytes disagree with its dtype and shape, or a name given twice.
std::string safetensors_bytes(const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

} // namespace meshsim
