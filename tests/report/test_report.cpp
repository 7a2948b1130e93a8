// Tests for src/report: atomic files, TensorBoard event files, memory.csv and memory.png.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "base/atomic_file.h"
#include "report/memory_report.h"
#include "report/tensorboard.h"

namespace fs = std::filesystem;
using namespace meshsim;

namespace {

/// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() /
           ("meshsim-report-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_raw(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// Sets an environment variable for one test and restores it afterwards.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const std::string& value) : name(n) {
    const char* v = std::getenv(n);
    had = v != nullptr;
    if (had) old = v;
    ::setenv(n, value.c_str(), 1);
  }
  ~ScopedEnv() { had ? ::setenv(name.c_str(), old.c_str(), 1) : ::unsetenv(name.c_str()); }
};

bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

std::vector<MemorySample> demo_samples(int gpus, int n) {
  std::vector<MemorySample> samples;
  for (int i = 0; i < n; ++i) {
    MemorySample s{i * 0.05, i / 10, i % 2 ? "backward" : "forward", {}};
    for (int g = 0; g < gpus; ++g) {
      s.bytes.push_back(static_cast<int64_t>((20 + 10 * std::sin(i * 0.3 + g) + g) * 1048576));
    }
    samples.push_back(s);
  }
  return samples;
}

std::string fake_program(const fs::path& dir, const std::string& body) {
  const fs::path p = dir / "fake-gnuplot.sh";
  write_raw(p, "#!/bin/sh\n" + body + "\n");
  fs::permissions(p, fs::perms::owner_all);
  return p.string();
}

} // namespace

TEST(ReportCrc32c, StandardCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(ReportCrc32c, Rfc3720Vectors) {
  unsigned char buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  EXPECT_EQ(crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf, 32), 0x46DD794Eu);
}

TEST(ReportCrc32c, MaskingFormula) {
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(ReportTensorBoard, ScalarEventBytesMatchProtobufEncoding) {
  // Event{wall_time: 1.5, step: 7, summary{value{tag: "a", simple_value: 2.0}}}, by hand.
  const unsigned char expected[] = {0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,  // wall_time
                                    0x10, 0x07,                           // step
                                    0x2A, 0x0A, 0x0A, 0x08,               // summary (10), value (8)
                                    0x0A, 0x01, 'a', 0x15, 0, 0, 0, 0x40};  // tag, simple_value
  EXPECT_EQ(encode_scalar_event("a", 2.0f, 7, 1.5),
            std::string(reinterpret_cast<const char*>(expected), sizeof(expected)));
}

TEST(ReportTensorBoard, RecordFraming) {
  const std::string data = "hello";
  const std::string rec = encode_tfrecord(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t len;
  uint32_t len_crc, data_crc;
  std::memcpy(&len, rec.data(), 8);
  std::memcpy(&len_crc, rec.data() + 8, 4);
  std::memcpy(&data_crc, rec.data() + 12 + data.size(), 4);
  EXPECT_EQ(len, data.size());
  EXPECT_EQ(len_crc, masked_crc32c(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(data_crc, masked_crc32c(data.data(), data.size()));
}

TEST(ReportTensorBoard, RoundTripScalars) {
  TempDir tmp;
  const std::vector<TensorBoardScalar> written = {
      {"loss/train", 2.302585f, 0, 1700000000.25},
      {"loss/train", 0.4375f, 1, 1700000001.5},
      {"accuracy", 0.875f, 1, 1700000001.5},
      {"lr", 1e-3f, 1234567890123LL, 1700000002.0},
      {"neg", -std::numeric_limits<float>::infinity(), -3, 0.0},
      {"tiny", std::numeric_limits<float>::denorm_min(), 5, 1.0},
  };
  fs::path file;
  {
    TensorBoardWriter writer(tmp.path / "tb" / "nested");
    for (const auto& s : written) writer.add_scalar(s.tag, s.value, s.step, s.wall_time);
    file = writer.path();
  }
  // events.out.tfevents.<unix_secs>.<hostname>.meshsim
  const std::string name = file.filename().string(), prefix = "events.out.tfevents.";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  EXPECT_GT(std::stoll(name.substr(prefix.size())), 1600000000LL) << name;
  EXPECT_EQ(name.substr(name.size() - 8), ".meshsim") << name;
  const auto events = read_tensorboard_events(file);
  ASSERT_EQ(events.size(), written.size() + 1);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.6e9);  // now, in Unix seconds
  EXPECT_TRUE(events[0].scalars.empty());

  const auto scalars = read_tensorboard_scalars(file);
  ASSERT_EQ(scalars.size(), written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ(scalars[i].tag, written[i].tag);
    EXPECT_EQ(std::memcmp(&scalars[i].value, &written[i].value, 4), 0) << written[i].tag;
    EXPECT_EQ(scalars[i].step, written[i].step);
    EXPECT_EQ(scalars[i].wall_time, written[i].wall_time);
  }
}

TEST(ReportTensorBoard, FlushMakesRecordsVisibleWhileOpen) {
  TempDir tmp;
  TensorBoardWriter writer(tmp.path);
  writer.add_scalar("loss", 1.0f, 1, 10.0);
  writer.flush();
  const auto scalars = read_tensorboard_scalars(writer.path());
  ASSERT_EQ(scalars.size(), 1u);
  EXPECT_EQ(scalars[0].tag, "loss");
}

TEST(ReportTensorBoard, TwoWritersInOneDirectoryDoNotClobber) {
  TempDir tmp;
  TensorBoardWriter a(tmp.path), b(tmp.path);
  EXPECT_NE(a.path(), b.path());
}

TEST(ReportTensorBoard, EveryFlippedByteIsDetected) {
  TempDir tmp;
  fs::path file;
  {
    TensorBoardWriter writer(tmp.path / "tb");
    writer.add_scalar("loss", 0.5f, 1, 100.0);
    writer.add_scalar("loss", 0.25f, 2, 101.0);
    file = writer.path();
  }
  const std::string good = read_all(file);
  const fs::path bad = tmp.path / "bad";
  for (size_t i = 0; i < good.size(); ++i) {
    std::string copy = good;
    copy[i] = static_cast<char>(copy[i] ^ 0x10);
    write_raw(bad, copy);
    EXPECT_THROW(read_tensorboard_scalars(bad), std::runtime_error) << "byte " << i;
  }
  std::string copy = good;
  copy[good.size() - 2] ^= 0x01;  // inside the last record's data CRC
  write_raw(bad, copy);
  try {
    read_tensorboard_scalars(bad);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
  }
}

TEST(ReportTensorBoard, TruncationThrowsUnlessAtARecordBoundary) {
  TempDir tmp;
  fs::path file;
  {
    TensorBoardWriter writer(tmp.path / "tb");
    for (int i = 0; i < 3; ++i) writer.add_scalar("x", i * 1.0f, i, 1.0 + i);
    file = writer.path();
  }
  const std::string good = read_all(file);
  std::vector<size_t> boundaries;
  for (size_t pos = 0; pos < good.size();) {
    boundaries.push_back(pos);
    uint64_t len;
    std::memcpy(&len, good.data() + pos, 8);
    pos += 16 + len;
  }
  ASSERT_EQ(boundaries.size(), 4u);
  const fs::path cut = tmp.path / "cut";
  for (size_t n = 1; n < good.size(); ++n) {
    write_raw(cut, good.substr(0, n));
    const auto at = std::find(boundaries.begin(), boundaries.end(), n);
    if (at == boundaries.end()) {
      EXPECT_THROW(read_tensorboard_events(cut), std::runtime_error) << "cut at " << n;
    } else {  // a whole-record prefix is a valid, shorter file
      EXPECT_EQ(read_tensorboard_events(cut).size(), static_cast<size_t>(at - boundaries.begin()));
    }
  }
  write_raw(cut, good.substr(0, good.size() - 1));
  try {
    read_tensorboard_events(cut);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("offset " + std::to_string(boundaries.back())),
              std::string::npos)
        << e.what();
  }
}

TEST(ReportAtomicFile, ReplacesContentAndLeavesNoTempFiles) {
  TempDir tmp;
  const fs::path p = tmp.path / "metrics.json";
  write_file_atomic(p, "old contents, longer than the new ones");
  write_file_atomic(p, "new");
  EXPECT_EQ(read_all(p), "new");
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{"metrics.json"});
}

TEST(ReportAtomicFile, ThrowsForMissingDirectory) {
  TempDir tmp;
  const fs::path p = tmp.path / "no-such-dir" / "x.txt";
  try {
    write_file_atomic(p, "x");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no-such-dir"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{});
}

TEST(ReportAtomicFile, ConcurrentReaderNeverSeesATornFile) {
  TempDir tmp;
  const fs::path p = tmp.path / "state.txt";
  const std::string a(64 * 1024, 'a'), b(32 * 1024, 'b');
  write_file_atomic(p, a);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 40; ++i) write_file_atomic(p, i % 2 ? a : b);
    done = true;
  });
  int reads = 0;
  while (!done) {
    const std::string seen = read_all(p);
    ASSERT_TRUE(seen == a || seen == b) << "torn read of " << seen.size() << " bytes";
    ++reads;
  }
  writer.join();
  EXPECT_GT(reads, 0);
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{"state.txt"});
}

// SIGTERM while a large file is being written (an export's state_dict) left a
// "<path>.tmp-PID-0" of the bytes written so far. With remove_temp_files_on_signals (what
// main() installs), the process still ends by the signal, the target is as it was, and no
// temporary is left beside it.
TEST(ReportAtomicFile, ASignalMidWriteLeavesTheTargetAsItWasAndNoTemporary) {
  TempDir tmp;
  const fs::path p = tmp.path / "model.pt";
  write_file_atomic(p, "the previous export");
  const std::string big(size_t{256} << 20, 'x'); // made before the fork: the child only reads it
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    remove_temp_files_on_signals();
    write_file_atomic(p, big);
    ::_exit(0);
  }
  // Polls the folder for the child's temporary: there is nothing to wait on in another process.
  bool seen = false;
  for (int i = 0; i < 20000 && !seen; ++i) {
    for (const std::string& name : names_in(tmp.path))
      seen = seen || name.find(".tmp-") != std::string::npos;
    if (!seen) ::usleep(100);
  }
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(seen) << "the write ended before the test saw its temporary";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(read_all(p), "the previous export");
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{"model.pt"});
}

TEST(ReportMemoryCsv, HeaderAndRows) {
  TempDir tmp;
  const std::vector<MemorySample> samples = {
      {0.5, 3, "forward", {1048576 * 3 / 2, 0}},
      {1.25, 4, "all_reduce, bucket 2", {1024, 10LL * 1024 * 1048576}},
  };
  const fs::path p = tmp.path / "memory.csv";
  write_memory_csv(p, samples, 2);
  EXPECT_EQ(read_all(p), "time_s,step,phase,gpu0_mib,gpu1_mib,phys_used_mib,phys_util_pct\n"
                         "0.500000,3,forward,1.500,0.000,,\n"
                         "1.250000,4,\"all_reduce, bucket 2\",0.001,10240.000,,\n");
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{"memory.csv"});
}

TEST(ReportMemoryCsv, CardReadingInTheLastTwoColumns) {
  // A CUDA run's rows carry NVML's reading of the card; one without utilisation (a MIG
  // instance) leaves that cell empty, and a failed reading leaves both.
  std::vector<MemorySample> samples = {
      {0.5, 3, "forward", {1048576, 2097152}},
      {0.75, 3, "backward", {1048576, 0}},
      {1.0, 4, "optimizer", {0, 0}},
  };
  samples[0].phys_used_bytes = 1536LL * 1048576 + 524288;
  samples[0].phys_util_pct = 42;
  samples[1].phys_used_bytes = 80LL << 30;
  EXPECT_EQ(memory_csv(samples, 2),
            "time_s,step,phase,gpu0_mib,gpu1_mib,phys_used_mib,phys_util_pct\n"
            "0.500000,3,forward,1.000,2.000,1536.500,42\n"
            "0.750000,3,backward,1.000,0.000,81920.000,\n"
            "1.000000,4,optimizer,0.000,0.000,,\n");
}

TEST(ReportMemoryCsv, WrongGpuCountThrows) {
  EXPECT_THROW(memory_csv({{0.0, 0, "x", {1, 2, 3}}}, 2), std::invalid_argument);
  EXPECT_EQ(memory_csv({}, 1), "time_s,step,phase,gpu0_mib,phys_used_mib,phys_util_pct\n");
}

TEST(ReportMemoryPlot, ScriptMarksCapacityOnScale) {
  const auto script = memory_plot_script(demo_samples(2, 20), {64LL << 20, 64LL << 20},
                                         "it's a_title^2", "/tmp/out.png");
  EXPECT_NE(script.find("set title 'it''s a_title^2'"), std::string::npos) << script;
  EXPECT_NE(script.find("set xlabel 'time (s)'"), std::string::npos);
  EXPECT_NE(script.find("set ylabel 'MiB'"), std::string::npos);
  EXPECT_NE(script.find("64 with lines dt 2"), std::string::npos) << script;
  EXPECT_NE(script.find("title 'capacity (64 MiB)'"), std::string::npos) << script;
  EXPECT_EQ(script.find("off scale"), std::string::npos);
}

TEST(ReportMemoryPlot, ScriptKeepsCurvesReadableWhenCapacityIsOffScale) {
  const int64_t cap = static_cast<int64_t>(5.8 * (1LL << 30));
  const auto script = memory_plot_script(demo_samples(4, 20), {cap, cap, cap, cap}, "t", "o.png");
  EXPECT_NE(script.find("capacity 5.8 GiB (off scale)"), std::string::npos) << script;
  const auto at = script.find("set yrange [0:");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stod(script.substr(at + 14)), 100.0) << "y range must fit the ~30 MiB curves";
}

TEST(ReportMemoryPlot, ScriptMarksEachDistinctCapacity) {
  const auto script = memory_plot_script(demo_samples(2, 5), {40LL << 20, 48LL << 20}, "t", "o.png");
  EXPECT_NE(script.find("'gpu0 capacity (40 MiB)'"), std::string::npos) << script;
  EXPECT_NE(script.find("'gpu1 capacity (48 MiB)'"), std::string::npos) << script;
}

/// The data rows of a memory plot script, each split on spaces.
std::vector<std::vector<std::string>> plot_rows(const std::string& script) {
  const auto begin = script.find("$mem << EOD\n");
  const auto end = script.find("EOD\n", begin + 12);
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(script.substr(begin + 12, end - begin - 12));
  std::string line, field;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    rows.emplace_back();
    while (fields >> field)
      rows.back().push_back(field);
  }
  return rows;
}

std::vector<MemorySample> with_card(std::vector<MemorySample> samples) {
  for (size_t i = 0; i < samples.size(); ++i) {
    if (i == 3)
      continue; // one failed reading: a gap in the card's line
    samples[i].phys_used_bytes = (600 + 5 * static_cast<int64_t>(i)) << 20;
    samples[i].phys_util_pct = static_cast<int>(i % 100);
  }
  return samples;
}

TEST(ReportMemoryPlot, ScriptHasNoCardLineWithoutNvml) {
  const auto script =
      memory_plot_script(demo_samples(2, 20), {64LL << 20, 64LL << 20}, "t", "o.png");
  EXPECT_EQ(script.find("card"), std::string::npos) << script;
  EXPECT_EQ(script.find("using 1:4"), std::string::npos) << script;
  for (const auto& row : plot_rows(script))
    EXPECT_EQ(row.size(), 3u);
}

TEST(ReportMemoryPlot, ScriptDrawsTheCardBesideTheGpus) {
  const auto script =
      memory_plot_script(with_card(demo_samples(2, 20)), {64LL << 20, 64LL << 20}, "t", "o.png");
  EXPECT_NE(script.find("$mem using 1:4 with lines lw 2 lc rgb 'black' title 'card (NVML) used'"),
            std::string::npos)
      << script;
  const auto rows = plot_rows(script);
  ASSERT_EQ(rows.size(), 20u);
  for (const auto& row : rows)
    ASSERT_EQ(row.size(), 4u);
  EXPECT_EQ(rows[0][3], "600.000");
  EXPECT_EQ(rows[3][3], "NaN");
  // The y range reaches the card's 695 MiB, and the 64 MiB capacity is still on scale.
  const auto at = script.find("set yrange [0:");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stod(script.substr(at + 14)), 695.0);
  EXPECT_NE(script.find("title 'capacity (64 MiB)'"), std::string::npos) << script;
}

TEST(ReportMemoryPlot, WritesPngWithCardLine) {
  if (!have_gnuplot())
    GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  TempDir tmp;
  const fs::path png = tmp.path / "memory.png";
  std::string error;
  ASSERT_TRUE(plot_memory(png, with_card(demo_samples(4, 60)),
                          {256LL << 20, 256LL << 20, 256LL << 20, 256LL << 20}, "card", &error))
      << error;
  EXPECT_EQ(read_all(png).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(ReportMemoryPlot, WritesPng) {
  if (!have_gnuplot()) GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  TempDir tmp;
  const fs::path png = tmp.path / "memory.png";
  std::string error;
  ASSERT_TRUE(plot_memory(png, demo_samples(4, 60), {64LL << 20, 64LL << 20, 64LL << 20, 64LL << 20},
                          "run 'demo' \"4 GPUs\"", &error))
      << error;
  const std::string bytes = read_all(png);
  EXPECT_GT(bytes.size(), 1024u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{"memory.png"});  // no script, no temp
}

TEST(ReportMemoryPlot, MissingGnuplotReturnsFalse) {
  TempDir tmp;
  ScopedEnv env("MESHSIM_GNUPLOT", (tmp.path / "no-such-gnuplot").string());
  std::string error;
  EXPECT_FALSE(plot_memory(tmp.path / "memory.png", demo_samples(2, 5), {}, "t", &error));
  EXPECT_NE(error.find("not found"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{});
}

TEST(ReportMemoryPlot, FailingGnuplotReturnsFalseWithItsMessage) {
  TempDir tmp;
  // Reads stdin first: if stdin were inherited this could block; it must see /dev/null.
  ScopedEnv env("MESHSIM_GNUPLOT",
                fake_program(tmp.path, "cat >/dev/null\necho 'line 3: bad thing' >&2\nexit 3"));
  std::string error;
  EXPECT_FALSE(plot_memory(tmp.path / "memory.png", demo_samples(2, 5), {}, "t", &error));
  EXPECT_EQ(error.find("exited with status 3"), error.find("exited")) << error;
  EXPECT_NE(error.find("line 3: bad thing"), std::string::npos) << error;
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{"fake-gnuplot.sh"});
}

TEST(ReportMemoryPlot, HangingGnuplotIsKilled) {
  TempDir tmp;
  ScopedEnv env("MESHSIM_GNUPLOT", fake_program(tmp.path, "sleep 30 & wait"));
  const fs::path script = tmp.path / "s.gp";
  write_raw(script, "\n");
  std::string error;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(run_gnuplot(script, 300, &error));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(error.find("timed out"), std::string::npos) << error;
}

TEST(ReportMemoryPlot, NoSamplesReturnsFalse) {
  TempDir tmp;
  std::string error;
  EXPECT_FALSE(plot_memory(tmp.path / "memory.png", {}, {}, "t", &error));
  EXPECT_FALSE(error.empty());
}
