// The safetensors reader and writer (base/safetensors.h): what it writes, the reference
// implementation (Python's safetensors) reads as the same tensors, and what that writes it
// reads; every malformed header is one DataError line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "../python_torch.h"
#include "base/errors.h"
#include "base/safetensors.h"

using namespace meshsim;
using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

std::string float_bytes(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

// A file of `header` (the JSON text) and `data` bytes.
std::string file_of(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

const std::vector<SafetensorsTensor> kSafetensorsSample = {
    {"b.weight", "F32", {2, 3}, float_bytes({1, 2, 3, 4, 5, 6})},
    {"a.bias", "F32", {3}, float_bytes({-1.5f, 0, 1e-30f})},
    {"empty", "F16", {0, 4}, ""},
    {"scalar", "I64", {}, std::string("\x07\0\0\0\0\0\0\0", 8)},
};

} // namespace

TEST(Safetensors, WrittenBytesReadBackAndAreAligned) {
  const std::string bytes = safetensors_bytes(kSafetensorsSample, {{"format", "pt"}});
  const SafetensorsHeader header =
      parse_safetensors_header(bytes, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(header.data_start % 8, 0);
  const SafetensorsFile file = parse_safetensors(bytes);
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(file.tensors.size(), kSafetensorsSample.size());
  for (size_t i = 0; i < file.tensors.size(); ++i) { // the data order is the order given
    EXPECT_EQ(file.tensors[i].name, kSafetensorsSample[i].name);
    EXPECT_EQ(file.tensors[i].dtype, kSafetensorsSample[i].dtype);
    EXPECT_EQ(file.tensors[i].shape, kSafetensorsSample[i].shape);
    EXPECT_EQ(file.tensors[i].data, kSafetensorsSample[i].data);
  }
  EXPECT_EQ(safetensors_bytes(file.tensors, file.metadata), bytes); // the same bytes again
}

TEST(Safetensors, MalformedFilesAreOneDataErrorLine) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string eight(8, 'x');
  const struct {
    std::string bytes, message;
  } cases[] = {
      {"", "too few for a safetensors file"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8), "over the limit"},
      {file_of(ok, eight).substr(0, 20), "runs past the end of the file"},
      {file_of("[1]", ""), "does not start with '{'"},
      {file_of("{\"t\":", ""), "not valid JSON"},
      {file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":1})", eight), "twice"},
      {file_of(R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", eight), "unknown dtype"},
      {file_of(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       "not a whole number"},
      {file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", eight),
       "needs 4 bytes; its data_offsets give 8"},
      {file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       "holds more than its 8 bytes"},
      {file_of(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
               eight),
       "holds more than its 8 bytes"},
      {file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
       "before it begins"},
      {file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "begins at 4"},
      {file_of(ok, eight + "xx"), "the file has 10 after the header"},
      {file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               eight),
       "not at 8"},
      {file_of(R"({"__metadata__":{"k":1}})", ""), "is not text"},
      {file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":0}})", eight),
       "unknown field"},
  };
  for (const auto& c : cases) {
    try {
      parse_safetensors(c.bytes);
      ADD_FAILURE() << "accepted: " << c.message;
    } catch (const DataError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.message), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

// The reference implementation reads meshsim's file as the same tensors, and meshsim reads the
// file it writes as the same bytes.
TEST(Safetensors, AgreesWithPythonsSafetensors) {
  if (!python_runs("import safetensors.torch"))
    GTEST_SKIP() << MESHSIM_PYTHON " cannot import safetensors (make test-torch2)";
  const fs::path dir =
      fs::temp_directory_path() / ("meshsim-safetensors-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "meshsim.safetensors", std::ios::binary)
      << safetensors_bytes(kSafetensorsSample, {{"format", "pt"}});
  const std::string script =
      "import sys, torch\n"
      "from safetensors.torch import load_file, save_file\n"
      "from safetensors import safe_open\n"
      "d = sys.argv[1]\n"
      "t = load_file(d + '/meshsim.safetensors')\n"
      "assert t['b.weight'].tolist() == [[1, 2, 3], [4, 5, 6]], t\n"
      "assert t['a.bias'].tolist() == [-1.5, 0.0, torch.tensor(1e-30).item()], t\n"
      "assert t['empty'].dtype == torch.float16 and t['empty'].shape == (0, 4)\n"
      "assert t['scalar'].dtype == torch.int64 and t['scalar'].item() == 7\n"
      "assert safe_open(d + '/meshsim.safetensors', 'pt').metadata() == {'format': 'pt'}\n"
      "save_file({'x': torch.arange(6, dtype=torch.float64).reshape(3, 2),\n"
      "           'y': torch.tensor([1.0, -2.0], dtype=torch.bfloat16)}, d + "
      "'/python.safetensors',\n"
      "          metadata={'by': 'python'})\n";
  std::ofstream(dir / "check.py") << script;
  const std::string cmd =
      MESHSIM_PYTHON " " + (dir / "check.py").string() + " " + dir.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const SafetensorsFile file = read_safetensors((dir / "python.safetensors").string());
  EXPECT_EQ(file.metadata.at("by"), "python");
  ASSERT_EQ(file.tensors.size(), 2u);
  for (const auto& t : file.tensors) {
    if (t.name == "x") {
      EXPECT_EQ(t.dtype, "F64");
      EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 2}));
      double v[6];
      std::memcpy(v, t.data.data(), sizeof v);
      for (int i = 0; i < 6; ++i)
        EXPECT_EQ(v[i], i);
    } else {
      EXPECT_EQ(t.name, "y");
      EXPECT_EQ(t.dtype, "BF16");
      EXPECT_EQ(t.data, std::string("\x80\x3f\x00\xc0", 4)); // 1.0 and -2.0 in bfloat16
    }
  }
  fs::remove_all(dir);
}
