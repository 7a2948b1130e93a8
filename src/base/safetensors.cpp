// The safetensors reader and writer: the header's checks first, then the bytes.
#include "base/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h> // fmt::join (in fmt/format.h before fmt 11)
#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"

namespace meshsim {
namespace {

// A non-negative integer of the header that fits int64, or a DataError naming `what`.
int64_t header_count(const nlohmann::json& v, const std::string& what) {
  if (!v.is_number_unsigned() ||
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw DataError(
        fmt::format("{} is {}, not a whole number of at least 0", what, printable(v.dump())));
  return static_cast<int64_t>(v.get<uint64_t>());
}

SafetensorsInfo parse_tensor_entry(const std::string& name, const nlohmann::json& v) {
  const std::string who = "tensor '" + printable(name) + "'";
  if (!v.is_object())
    throw DataError(who + " is not an object");
  for (const auto& item : v.items())
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets")
      throw DataError(fmt::format("{} has an unknown field '{}'", who, printable(item.key())));
  if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    throw DataError(who + " lacks dtype, shape or data_offsets");
  SafetensorsInfo info;
  info.name = name;
  if (!v["dtype"].is_string() || safetensors_dtype_size(v["dtype"].get<std::string>()) == 0)
    throw DataError(fmt::format("{} has an unknown dtype {}", who, printable(v["dtype"].dump())));
  info.dtype = v["dtype"].get<std::string>();
  if (!v["shape"].is_array())
    throw DataError(who + "'s shape is not a list");
  for (const auto& d : v["shape"])
    info.shape.push_back(header_count(d, who + "'s shape entry"));
  const auto& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    throw DataError(who + "'s data_offsets is not [begin, end]");
  info.begin = header_count(offsets[0], who + "'s begin");
  info.end = header_count(offsets[1], who + "'s end");
  if (info.end < info.begin)
    throw DataError(
        fmt::format("{} ends at {}, before it begins at {}", who, info.end, info.begin));
  // Its byte count from dtype and shape, refused once it exceeds what it was given.
  const int64_t given = info.end - info.begin;
  int64_t bytes = safetensors_dtype_size(info.dtype);
  bool zero = false;
  for (int64_t d : info.shape)
    zero = zero || d == 0;
  if (zero)
    bytes = 0;
  for (size_t i = 0; i < info.shape.size() && !zero; ++i) {
    if (bytes > given / info.shape[i])
      throw DataError(fmt::format("{} of shape [{}] holds more than its {} bytes", who,
                                  fmt::join(info.shape, ", "), given));
    bytes *= info.shape[i];
  }
  if (bytes != given)
    throw DataError(fmt::format("{} of {} [{}] needs {} bytes; its data_offsets give {}", who,
                                info.dtype, fmt::join(info.shape, ", "), bytes, given));
  return info;
}

int64_t file_size_of(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec)
    throw DataError(fmt::format("{}: cannot read its size ({})", printable(path), ec.message()));
  return static_cast<int64_t>(size);
}

} // namespace

int64_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

SafetensorsHeader parse_safetensors_header(const std::string& prefix, int64_t file_size) {
  if (file_size < 8 || prefix.size() < 8)
    throw DataError(fmt::format("{} bytes are too few for a safetensors file (8 give the "
                                "header's length)",
                                file_size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(prefix[static_cast<size_t>(i)]);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeader))
    throw DataError(fmt::format("its header length {} is over the limit of {} bytes", n,
                                kMaxSafetensorsHeader));
  const auto length = static_cast<int64_t>(n);
  if (8 + length > file_size)
    throw DataError(fmt::format("its header of {} bytes runs past the end of the file ({} bytes)",
                                length, file_size));
  if (static_cast<int64_t>(prefix.size()) < 8 + length)
    throw std::logic_error("parse_safetensors_header: the prefix does not hold the header");
  const std::string text = prefix.substr(8, static_cast<size_t>(length));
  if (text.empty() || text[0] != '{')
    throw DataError("its header does not start with '{'");
  nlohmann::json doc;
  try {
    doc = parse_json(text, "its header");
  } catch (const JsonError& e) {
    throw DataError(e.what());
  }
  if (!doc.is_object())
    throw DataError("its header is not a JSON object");
  SafetensorsHeader header;
  header.data_start = 8 + length;
  for (const auto& item : doc.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object())
        throw DataError("its __metadata__ is not an object");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string())
          throw DataError(fmt::format("its __metadata__ '{}' is not text", printable(m.key())));
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_tensor_entry(item.key(), item.value()));
  }
  // The tensors tile the data: sorted by where they begin, each starts where the last ended,
  // and the last ends at the end of the file.
  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const SafetensorsInfo& a, const SafetensorsInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  int64_t at = 0;
  for (const auto& t : header.tensors) {
    if (t.begin != at)
      throw DataError(fmt::format("tensor '{}' begins at {}, not at {} where the one before ends",
                                  printable(t.name), t.begin, at));
    at = t.end;
  }
  if (at != file_size - header.data_start)
    throw DataError(fmt::format("its tensors hold {} bytes; the file has {} after the header", at,
                                file_size - header.data_start));
  return header;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  if (const std::string why = input_file_problem(path); !why.empty())
    throw DataError(fmt::format("{} {}", printable(path), why));
  const int64_t size = file_size_of(path);
  std::ifstream in(path, std::ios::binary);
  std::string prefix(8, '\0');
  if (!in.read(prefix.data(), 8))
    prefix.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  try {
    if (prefix.size() == 8) {
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i)
        n = (n << 8) | static_cast<unsigned char>(prefix[static_cast<size_t>(i)]);
      // Only a length the file can hold is read; parse refuses the others.
      if (n <= static_cast<uint64_t>(std::min(kMaxSafetensorsHeader, size - 8))) {
        prefix.resize(8 + n);
        if (!in.read(prefix.data() + 8, static_cast<std::streamsize>(n)))
          throw DataError("it is shorter than its size said (it changed while read)");
      }
    }
    return parse_safetensors_header(prefix, size);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {}", printable(path), e.what()));
  }
}

SafetensorsFile parse_safetensors(const std::string& bytes) {
  const SafetensorsHeader header =
      parse_safetensors_header(bytes, static_cast<int64_t>(bytes.size()));
  SafetensorsFile file;
  file.metadata = header.metadata;
  for (const auto& t : header.tensors)
    file.tensors.push_back({t.name, t.dtype, t.shape,
                            bytes.substr(static_cast<size_t>(header.data_start + t.begin),
                                         static_cast<size_t>(t.end - t.begin))});
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string bytes = read_input_file(path, "weights", kMaxSafetensorsBytes);
  try {
    return parse_safetensors(bytes);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {}", printable(path), e.what()));
  }
}

std::string safetensors_bytes(const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  std::set<std::string> names;
  int64_t at = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw std::invalid_argument("safetensors: the name '" + printable(t.name) +
                                  "' is reserved or given twice");
    int64_t bytes = safetensors_dtype_size(t.dtype);
    for (int64_t d : t.shape)
      bytes *= d;
    if (bytes != static_cast<int64_t>(t.data.size()) || safetensors_dtype_size(t.dtype) == 0)
      throw std::invalid_argument(fmt::format("safetensors: tensor '{}' of {} [{}] has {} bytes",
                                              printable(t.name), t.dtype, fmt::join(t.shape, ", "),
                                              t.data.size()));
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + static_cast<size_t>(at));
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff));
  out += text;
  for (const auto& t : tensors)
    out += t.data;
  return out;
}

} // namespace meshsim
