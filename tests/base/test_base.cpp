// The generic pieces every layer uses on outside input: printable text, input files, strict
// JSON and output folders.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/input_file.h"
#include "base/json_input.h"
#include "base/out_folder.h"
#include "base/printable.h"
#include "config/config.h"

namespace fs = std::filesystem;
using namespace meshsim;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace base_test {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("meshsim-base-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(BasePrintable, ControlCharactersNulAndStrayBytesAreEscapedValidUtf8Kept) {
  EXPECT_EQ(printable("plain"), "plain");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("line\nbreak\r"), "line\\x0abreak\\x0d");
  EXPECT_EQ(printable("× µ 𝜋"), "× µ 𝜋");            // two, two and four bytes
  EXPECT_EQ(printable("\xc3"), "\\xc3");              // a sequence cut short
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");     // an overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80"); // a surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80"); // past U+10FFFF
  EXPECT_EQ(printable("\x7f"), "\\x7f");
}

// What a child process said last: its last line that is not blank, without trailing spaces.
TEST(BasePrintable, LastLineIsTheLastOneThatIsNotBlank) {
  EXPECT_EQ(last_line("first\nmeshsim: out of memory  \r\n\n \t\n"), "meshsim: out of memory");
  EXPECT_EQ(last_line("  only one"), "  only one");
  EXPECT_EQ(last_line(""), "");
  EXPECT_EQ(last_line("\n \n\t"), "");
}

TEST(BaseInputFile, RefusesEveryKindThatIsNotARegularFileInOneLine) {
  TempDir tmp;
  const fs::path fifo = tmp.path / "fifo", dangling = tmp.path / "dangling", loop = tmp.path / "loop";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_symlink(tmp.path / "none", dangling);
  fs::create_symlink(loop, loop);
  const std::pair<fs::path, std::string> cases[] = {
      {tmp.path, "is a folder, not a file"},
      {"/dev/zero", "is a device, not a file"},
      {fifo, "is a FIFO (named pipe), not a file"},
      {dangling, "is a dangling symbolic link"},
      {loop, "is a loop of symbolic links"},
      {tmp.path / "missing", "does not exist"},
      {"", "is an empty path"},
  };
  for (const auto& [path, why] : cases) {
    const std::string e = error_of([&] { read_input_file(path.string(), "text data", 1 << 20); });
    EXPECT_EQ(e.rfind("text data " + (path.empty() ? std::string("''") : path.string()) + ": " + why, 0), 0u) << e;
    EXPECT_EQ(input_file_problem(path.string()).rfind(why, 0), 0u) << path;
  }
  EXPECT_EQ(path_kind(tmp.path.string()), PathKind::kFolder);
  EXPECT_EQ(path_kind((tmp.path / "missing").string()), PathKind::kNothing);
  EXPECT_EQ(path_kind(dangling.string()), PathKind::kOther);
  EXPECT_EQ(folder_problem("/dev/zero"), "is a device, not a folder");
}

TEST(BaseInputFile, ReadsARegularFileWholeAndRefusesOneTooLarge) {
  TempDir tmp;
  const fs::path f = tmp.path / "data.txt";
  std::ofstream(f) << "0123456789";
  EXPECT_EQ(read_input_file(f.string(), "text data", 10), "0123456789");
  const std::string e = error_of([&] { read_input_file(f.string(), "text data", 9); });
  EXPECT_EQ(e, "text data " + f.string() + ": is 10 B, more than the 9 B meshsim reads as a text data");
}

TEST(BaseJson, ADuplicateKeyAtAnyDepthIsRefused) {
  EXPECT_EQ(parse_json(R"({"a": 1, "b": {"a": 2}})", "x")["b"]["a"], 2);
  EXPECT_EQ(error_of([] { parse_json(R"({"a": 1, "a": 2})", "config.json"); }),
            "config.json: key \"a\" appears twice in one object");
  EXPECT_EQ(error_of([] { parse_json(R"([{"k": 1}, {"g": {"k": 1, "k": 2}}])", "x"); }),
            "x: key \"k\" appears twice in one object");
  // The same key in sibling objects is no duplicate.
  EXPECT_NO_THROW(parse_json(R"([{"k": 1}, {"k": 2}])", "x"));
  const std::string bad = error_of([] { parse_json("{\"a\": \"\xc3", "records.json"); });
  EXPECT_EQ(bad.rfind("records.json: not valid JSON (", 0), 0u) << bad;
  EXPECT_EQ(bad.find('\xc3'), std::string::npos) << bad;
}

TEST(BaseOutFolder, SaysWhyAFolderCannotBeWritten) {
  TempDir tmp;
  const fs::path file = tmp.path / "file";
  std::ofstream(file) << "x";
  EXPECT_EQ(out_folder_problem((tmp.path / "new" / "run").string()), "");
  EXPECT_EQ(out_folder_problem(tmp.path.string()), "");
  EXPECT_EQ(out_folder_problem(file.string()), "is a file, not a folder");
  EXPECT_EQ(out_folder_problem("/dev/null"), "is a device, not a folder");
  EXPECT_EQ(out_folder_problem((file / "run").string()),
            "cannot be made: " + file.string() + " is a file, not a folder");
  EXPECT_FALSE(is_nonempty_folder(tmp.path.string() + "/new"));
  EXPECT_TRUE(is_nonempty_folder(tmp.path.string()));
}

TEST(ConfigFingerprint, TheFirstFieldThatDiffersIsNamedWithBothValues) {
  TrainConfig a;
  TrainConfig b = a;
  EXPECT_FALSE(first_difference(configuration_fingerprint(a), configuration_fingerprint(b)));
  b.shape.hidden = 32;
  b.optimizer.name = "sgd";
  const auto d = first_difference(configuration_fingerprint(a), configuration_fingerprint(b));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->field, "gpt.hidden"); // keys in sorted order: "gpt" before "optimizer"
  EXPECT_EQ(d->a, "64");
  EXPECT_EQ(d->b, "32");
  b = a;
  b.out = "elsewhere";
  const auto out = first_difference(configuration_fingerprint(a), configuration_fingerprint(b));
  ASSERT_TRUE(out);
  EXPECT_EQ(out->field, "out");
  EXPECT_EQ(out->b, "\"elsewhere\"");
}

} // namespace base_test
