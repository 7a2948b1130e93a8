// TFRecord framing, CRC-32C and the hand-written protobuf encoding of tensorflow.Event.
//
// Field numbers (tensorflow/core/util/event.proto, summary.proto):
//   Event:   wall_time=1 (double), step=2 (int64), file_version=3 (string), summary=5 (Summary)
//   Summary: value=1 (repeated Value)
//   Value:   tag=1 (string), simple_value=2 (float)
#include "report/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace meshsim {
namespace {

// Wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire) { put_varint(out, (field << 3) | wire); }
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as protobuf and TFRecord store them
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "fixed32/fixed64 only");
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));  // x86/ARM hosts are little-endian
}
void put_bytes(std::string& out, int field, const std::string& s) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, s.size());
  out += s;
}

/// Cursor over one protobuf message inside the whole file's bytes, so positions are offsets.
class ProtoReader {
public:
  ProtoReader(const std::string& buf, size_t begin, size_t end)
      : buf_(buf), pos_(begin), end_(end) {}
  bool done() const { return pos_ >= end_; }
  [[noreturn]] void error(const std::string& what) const {
    throw std::runtime_error("bad Event protobuf at offset " + std::to_string(pos_) +
                             ": " + what);
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= end_) error("truncated varint");
      const auto byte = static_cast<unsigned char>(buf_[pos_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    error("varint longer than 10 bytes");
  }
  template <typename T>
  T fixed() {
    if (end_ - pos_ < sizeof(T)) error("truncated fixed-width field");
    T v;
    std::memcpy(&v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  /// Returns [begin, end) of a length-delimited field's payload and skips over it.
  std::pair<size_t, size_t> delimited() {
    const uint64_t n = varint();
    if (n > end_ - pos_) error("length-delimited field runs past its message");
    const size_t begin = pos_;
    pos_ += n;
    return {begin, pos_};
  }
  void skip(int wire) {
    switch (wire) {
      case kVarint: varint(); break;
      case kFixed64: fixed<uint64_t>(); break;
      case kLengthDelimited: delimited(); break;
      case kFixed32: fixed<uint32_t>(); break;
      default: error("unsupported wire type " + std::to_string(wire));
    }
  }
  ProtoReader sub(std::pair<size_t, size_t> range) const {
    return ProtoReader(buf_, range.first, range.second);
  }
  const std::string& buf() const { return buf_; }

private:
  const std::string& buf_;
  size_t pos_, end_;
};

void expect_wire(ProtoReader& r, int wire, int expected) {
  if (wire != expected) r.error("field has wire type " + std::to_string(wire));
}

/// False for a Value without simple_value (images, histograms, tensors: not meshsim's).
bool decode_value(ProtoReader r, TensorBoardScalar* s) {
  bool has_simple_value = false;
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1) {
      expect_wire(r, wire, kLengthDelimited);
      const auto range = r.delimited();
      s->tag = r.buf().substr(range.first, range.second - range.first);
    } else if (field == 2) {
      expect_wire(r, wire, kFixed32);
      s->value = r.fixed<float>();
      has_simple_value = true;
    } else {
      r.skip(wire);
    }
  }
  return has_simple_value;
}

TensorBoardEvent decode_event(ProtoReader r) {
  TensorBoardEvent e;
  std::vector<ProtoReader> summaries;
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1) {
      expect_wire(r, wire, kFixed64);
      e.wall_time = r.fixed<double>();
    } else if (field == 2) {
      expect_wire(r, wire, kVarint);
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == 3) {
      expect_wire(r, wire, kLengthDelimited);
      const auto range = r.delimited();
      e.file_version = r.buf().substr(range.first, range.second - range.first);
    } else if (field == 5) {
      expect_wire(r, wire, kLengthDelimited);
      summaries.push_back(r.sub(r.delimited()));
    } else {
      r.skip(wire);
    }
  }
  // Decoded after the loop: protobuf allows step to follow the summary.
  for (auto& summary : summaries) {
    while (!summary.done()) {
      const uint64_t key = summary.varint();
      if ((key >> 3) != 1) { summary.skip(static_cast<int>(key & 7)); continue; }
      expect_wire(summary, static_cast<int>(key & 7), kLengthDelimited);
      TensorBoardScalar s;
      if (!decode_value(summary.sub(summary.delimited()), &s)) continue;
      s.step = e.step;
      s.wall_time = e.wall_time;
      e.scalars.push_back(std::move(s));
    }
  }
  return e;
}

uint32_t read_u32(const std::string& buf, size_t pos) {
  uint32_t v;
  std::memcpy(&v, buf.data() + pos, 4);
  return v;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string name(buf);
  for (char& c : name) if (c == '/' || c == '\\') c = '_';
  return name;
}

} // namespace

std::string encode_tfrecord(const std::string& data) {
  std::string out, len;
  put_fixed<uint64_t>(len, data.size());
  out += len;
  put_fixed<uint32_t>(out, masked_crc32c(len.data(), len.size()));
  out += data;
  put_fixed<uint32_t>(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string encode_scalar_event(const std::string& tag, float value, int64_t step,
                                double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_tag(v, 2, kFixed32);
  put_fixed<float>(v, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string event;
  put_tag(event, 1, kFixed64);
  put_fixed<double>(event, wall_time);
  put_tag(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, 5, summary);
  return event;
}

std::string encode_file_version_event(const std::string& file_version, double wall_time) {
  std::string event;
  put_tag(event, 1, kFixed64);
  put_fixed<double>(event, wall_time);
  put_bytes(event, 3, file_version);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir.string() + ": " + ec.message());
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const double wall_time = std::chrono::duration<double>(now).count();
  const std::string base = "events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(wall_time)) + "." + host_name() +
                           ".meshsim";
  // Two writers in one directory within a second would share a name: "x" (O_EXCL) makes the
  // second pick a numbered name instead of truncating the first one's file.
  for (int n = 0; file_ == nullptr; ++n) {
    path_ = dir / (n == 0 ? base : base + "." + std::to_string(n));
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && (errno != EEXIST || n >= 1000)) {
      throw std::runtime_error("cannot create " + path_.string() + ": " + std::strerror(errno));
    }
  }
  write_record(encode_file_version_event("brain.Event:2", wall_time));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string record = encode_tfrecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    throw std::runtime_error("cannot write " + path_.string() + ": " + std::strerror(errno));
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, float value, int64_t step,
                                   double wall_time) {
  const std::string event = encode_scalar_event(tag, value, step, wall_time);
  std::lock_guard<std::mutex> lock(mutex_);
  write_record(event);
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fflush(file_) != 0) {
    throw std::runtime_error("cannot write " + path_.string() + ": " + std::strerror(errno));
  }
}

std::vector<TensorBoardEvent> read_tensorboard_events(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + file.string());
  const std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string where = " in " + file.string();

  std::vector<TensorBoardEvent> events;
  size_t pos = 0;
  while (pos < buf.size()) {
    const std::string at = " at offset " + std::to_string(pos) + where;
    if (buf.size() - pos < 12) throw std::runtime_error("truncated record header" + at);
    uint64_t len;
    std::memcpy(&len, buf.data() + pos, 8);
    if (read_u32(buf, pos + 8) != masked_crc32c(buf.data() + pos, 8)) {
      throw std::runtime_error("bad length CRC" + at);
    }
    if (len > buf.size() - pos - 12 || buf.size() - pos - 12 - len < 4) {
      throw std::runtime_error("truncated record (" + std::to_string(len) + " data bytes)" + at);
    }
    const size_t data = pos + 12;
    if (read_u32(buf, data + len) != masked_crc32c(buf.data() + data, len)) {
      throw std::runtime_error("bad data CRC" + at);
    }
    events.push_back(decode_event(ProtoReader(buf, data, data + len)));
    pos = data + len + 4;
  }
  return events;
}

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::filesystem::path& file) {
  std::vector<TensorBoardScalar> out;
  for (auto& event : read_tensorboard_events(file)) {
    for (auto& s : event.scalars) out.push_back(std::move(s));
  }
  return out;
}

} // namespace meshsim
