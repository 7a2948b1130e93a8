// Pickle protocol 2 opcodes, as Python's pickle module (Lib/pickle.py) defines them.
#include "base/pickle.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace meshsim {
namespace {

constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt = 'J';     // 4-byte signed little-endian
constexpr char kLong1 = '\x8a';   // 1-byte length, two's complement little-endian
constexpr char kBinFloat = 'G';   // 8-byte big-endian double
constexpr char kBinUnicode = 'X'; // 4-byte little-endian length, UTF-8
constexpr char kEmptyList = ']';
constexpr char kEmptyDict = '}';
constexpr char kMark = '(';
constexpr char kAppends = 'e';
constexpr char kSetItems = 'u';

void little_endian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void integer(std::string& out, int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    out += kBinInt;
    little_endian(out, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    return;
  }
  out += kLong1;
  out += static_cast<char>(8);
  little_endian(out, static_cast<uint64_t>(v), 8);
}

void unsigned_integer(std::string& out, uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return integer(out, static_cast<int64_t>(v));
  out += kLong1;  // a 9th byte of 0 keeps it positive
  out += static_cast<char>(9);
  little_endian(out, v, 8);
  out += '\0';
}

void text(std::string& out, const std::string& s) {
  out += kBinUnicode;
  little_endian(out, s.size(), 4);
  out += s;
}

void write(std::string& out, const nlohmann::json& v) {
  switch (v.type()) {
  case nlohmann::json::value_t::null: out += kNone; return;
  case nlohmann::json::value_t::boolean: out += v.get<bool>() ? kNewTrue : kNewFalse; return;
  case nlohmann::json::value_t::number_integer: integer(out, v.get<int64_t>()); return;
  case nlohmann::json::value_t::number_unsigned: unsigned_integer(out, v.get<uint64_t>()); return;
  case nlohmann::json::value_t::number_float: {
    const double d = v.get<double>();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    out += kBinFloat;
    for (int i = 7; i >= 0; --i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
    return;
  }
  case nlohmann::json::value_t::string: text(out, v.get<std::string>()); return;
  case nlohmann::json::value_t::array:
    out += kEmptyList;
    if (v.empty()) return;
    out += kMark;
    for (const auto& item : v) write(out, item);
    out += kAppends;
    return;
  case nlohmann::json::value_t::object:
    out += kEmptyDict;
    if (v.empty()) return;
    out += kMark;
    for (const auto& [key, item] : v.items()) {
      text(out, key);
      write(out, item);
    }
    out += kSetItems;
    return;
  default: throw std::invalid_argument("to_pickle: a value pickle cannot hold");
  }
}

} // namespace

std::string to_pickle(const nlohmann::json& value) {
  std::string out;
  out += kProto;
  out += '\x02';
  write(out, value);
  out += kStop;
  return out;
}

} // namespace meshsim
