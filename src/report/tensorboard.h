// TensorBoard event files, written and read without TensorFlow or protobuf libraries.
//
// An event file is a TFRecord stream: each record is a little-endian uint64 length, the
// masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data. The data is
// a serialized tensorflow.Event; meshsim writes only the few fields TensorBoard needs for
// scalars (wall_time, step, file_version, summary.value{tag, simple_value}) and encodes them
// by hand. The reader exists so tests (and `meshsim` itself) can check what was written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "base/crc32c.h"

namespace meshsim {

/// One TFRecord frame around `data` (length, masked length CRC, data, masked data CRC).
std::string encode_tfrecord(const std::string& data);
/// Serialized Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string encode_scalar_event(const std::string& tag, float value, int64_t step,
                                double wall_time);
/// Serialized Event{wall_time, file_version} (the first record of every event file).
std::string encode_file_version_event(const std::string& file_version, double wall_time);

/// Appends scalar events to events.out.tfevents.<unix_secs>.<hostname>.meshsim in `dir`.
/// Thread-safe: ranks may log from their own threads.
class TensorBoardWriter {
public:
  /// Creates `dir` (and parents) and the event file, whose first record is
  /// Event{wall_time: now, file_version: "brain.Event:2"}. Throws std::runtime_error.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// wall_time is seconds since the Unix epoch (TensorBoard's "relative" axis uses it).
  void add_scalar(const std::string& tag, float value, int64_t step, double wall_time);
  /// Hands buffered records to the OS, so a TensorBoard reading the file sees them.
  void flush();
  std::filesystem::path path() const { return path_; }

private:
  void write_record(const std::string& data);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

struct TensorBoardScalar {
  std::string tag;
  float value = 0;
  int64_t step = 0;
  double wall_time = 0;
};

/// One decoded Event: the fields meshsim writes.
struct TensorBoardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                // empty unless this is the file_version record
  std::vector<TensorBoardScalar> scalars;  // summary values that carry a simple_value
};

/// Reads every record, verifying framing and both CRCs, and decodes the Events.
/// Throws std::runtime_error naming the byte offset on a bad CRC, truncation or bad protobuf.
std::vector<TensorBoardEvent> read_tensorboard_events(const std::filesystem::path& file);
/// The scalars of read_tensorboard_events, in file order.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::filesystem::path& file);

} // namespace meshsim
