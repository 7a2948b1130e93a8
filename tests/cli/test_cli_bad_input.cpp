// Bad input by class, as a new user and then a hostile one would give it: every path argument
// given a folder, a device, a FIFO, a dangling link and a loop of links; every integer flag 0,
// -1 and 2^63; every size flag its overflow; every --out a file, a folder that holds files and
// one that cannot be written. Each is refused before any work, in one line that names the
// value, with the README's exit code, and nothing crashes or hangs.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <set>

#include "cli_harness.h"
#include "base/crc32c.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace bad_input {

// The strange things a path can name, made once in a fresh folder.
struct StrangePaths {
  fs::path dir, device = "/dev/zero", fifo, dangling, loop, file;
  StrangePaths() {
    dir = fresh_dir("strange");
    fs::create_directories(dir / "folder");
    fs::create_directories(dir / "full");
    std::ofstream(dir / "full" / "other-run.txt") << "x\n";
    fifo = dir / "fifo";
    ::mkfifo(fifo.c_str(), 0644);
    dangling = dir / "dangling";
    fs::create_symlink(dir / "nothing-here", dangling);
    loop = dir / "loop";
    fs::create_symlink(dir / "loop", loop);
    file = dir / "file.txt";
    std::ofstream(file) << "a regular file\n";
  }
  fs::path folder() const { return dir / "folder"; }
  fs::path full() const { return dir / "full"; }
};

const StrangePaths& strange() {
  static const StrangePaths paths;
  return paths;
}

// The output is exactly one line that names `value`, and the exit code is one of `codes`.
void expect_one_line_naming(const CliResult& r, const std::string& value, std::set<int> codes,
                            const std::string& what) {
  EXPECT_TRUE(codes.count(r.code)) << what << ": exit " << r.code << "\n" << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << what << ": not one line\n"
                                                                 << r.output;
  EXPECT_NE(r.output.find(value), std::string::npos) << what << ": does not name " << value
                                                     << "\n" << r.output;
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const std::string kGpt = "--model gpt --layers 2 --hidden 32 --heads 4 --seq-len 16 --vocab 256 ";
const std::string kPlanGpt = "plan " + kGpt + "--cluster 1xh100 --batch-size 2 ";

// `head` with the small GPT's flags, each replaced by `flags`' own value of it where `flags`
// gives one (CLI11 refuses a flag given twice).
std::string small_gpt(const std::string& head, const std::string& flags) {
  const std::vector<std::pair<std::string, std::string>> base = {
      {"--model", "gpt"}, {"--layers", "2"},  {"--hidden", "32"}, {"--heads", "4"},
      {"--seq-len", "16"}, {"--vocab", "256"}, {"--batch-size", "2"}};
  std::string out = head;
  for (const auto& [f, v] : base)
    if (flags.find(f + " ") == std::string::npos) out += " " + f + " " + v;
  return out + " " + flags;
}

std::string plan_with(const std::string& flag, const std::string& value) {
  return small_gpt(flag == "--cluster" ? "plan" : "plan --cluster 1xh100", flag + " " + value);
}

// `command` run by the shell, stdout and stderr together.
CliResult run_shell(const std::string& command) {
  CliResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  r.output = read_all(pipe);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// ------------------------------------------------------------------------- in process

// The sweeps below run meshsim inside the test process (run_meshsim_in_process_exactly, which
// saves each refusal the start of a process): it answers with the binary's exit code and its
// very output, for a refusal of each kind they sweep, a --help, and a plan that runs.
TEST(CliBadInput, InProcessAnswersAsTheBinaryDoes) {
  const StrangePaths& p = strange();
  const std::vector<std::string> commands = {
      plan_with("--layers", "-1"),
      plan_with("--seq-len", "0"),
      small_gpt("train --data synthetic", "--bucket-mb 1e300"),
      "train " + kGpt + "--data " + p.fifo.string() + " --no-progress",
      kPlanGpt + "--out " + p.file.string(),
      "plan --model llama --moe-experts 6 --ep 4 --cluster 8xh100",
      "predict " + p.folder().string() + " --cluster 8xh100 --gpus 0",
      "plan --help",
      kPlanGpt + "--json"};
  for (const std::string& args : commands) {
    const auto binary = run_meshsim_exactly(args);
    const auto here = run_meshsim_in_process_exactly(args);
    EXPECT_EQ(here.code, binary.code) << args;
    EXPECT_EQ(here.output, binary.output) << args;
  }
  // And a value the binary refuses is refused here, so the sweeps cannot pass by not running.
  EXPECT_EQ(run_meshsim_in_process_exactly(plan_with("--layers", "-1")).code, 2);
  EXPECT_EQ(run_meshsim_in_process_exactly(kPlanGpt + "--json").code, 0);
}

// ------------------------------------------------------------------------- path arguments

// Every path meshsim reads, given each strange thing. Data is exit 3 (README: missing or
// malformed data); a name that is not a run folder or checkpoint is exit 2.
TEST(CliBadInput, EveryPathArgumentRefusesFoldersDevicesFifosAndBrokenLinks) {
  const StrangePaths& p = strange();
  const auto out = fresh_dir("paths-out");
  fs::create_directories(out);
  struct Use {
    std::string name, before, after;
    std::set<int> codes;
  };
  const std::vector<Use> uses = {
      {"train --data (text)", "train " + kGpt + "--data ", "", {3}},
      {"train --data (IDX folder)", "train --data ", "", {3}},
      {"train --config", "train --config ", "", {3}},
      {"train --resume", "train --data synthetic --resume ", "", {2, 3}},
      {"predict RUN", "predict ", " --cluster 8xh100", {2, 3}},
      {"export RUN", "export ", " --state-dict " + (out / "m.pt").string(), {2, 3}},
  };
  const std::vector<std::pair<std::string, fs::path>> things = {
      {"a device", p.device}, {"a FIFO", p.fifo}, {"a dangling link", p.dangling},
      {"a loop of links", p.loop}, {"a folder", p.folder()}};
  for (const Use& use : uses)
    for (const auto& [kind, path] : things) {
      // A folder is what --data names for IDX files, --resume and predict and export take.
      if (kind == "a folder" && use.name != "train --data (text)" && use.name != "train --config")
        continue;
      CliResult r;
      const double s = seconds_of([&] {
        r = run_meshsim_in_process_exactly(use.before + path.string() + use.after +
                                           (use.before.rfind("train", 0) == 0 ? " --no-progress"
                                                                              : ""));
      });
      expect_one_line_naming(r, path.string(), use.codes, use.name + " given " + kind);
      EXPECT_LT(s, 30) << use.name << " given " << kind << " took " << s << " s";
    }
  // The reason is given, not only the refusal.
  const auto loop = run_meshsim_in_process("train " + kGpt + "--data " + p.loop.string());
  EXPECT_NE(loop.output.find("loop of symbolic links"), std::string::npos) << loop.output;
  const auto dangling = run_meshsim_in_process("train " + kGpt + "--data " + p.dangling.string());
  EXPECT_NE(dangling.output.find("dangling symbolic link"), std::string::npos) << dangling.output;
  const auto zero = run_meshsim_in_process("train " + kGpt + "--data /dev/zero");
  EXPECT_NE(zero.output.find("is a device, not a file"), std::string::npos) << zero.output;
  // A --config that names nothing stays a mistyped flag (exit 2, tested in ConfigFile.*).
}

// A text file larger than meshsim reads whole is refused before it is read.
TEST(CliBadInput, ATextFileTooLargeIsRefusedBeforeItIsRead) {
  const auto dir = fresh_dir("big-text");
  fs::create_directories(dir);
  const fs::path big = dir / "big.txt";
  {
    std::ofstream f(big);
  }
  fs::resize_file(big, (int64_t{256} << 20) + 1); // sparse: no disk used
  const auto r = run_meshsim("train " + kGpt + "--data " + big.string());
  expect_one_line_naming(r, big.string(), {3}, "a 256 MiB + 1 text");
  EXPECT_NE(r.output.find("more than the 256.0 MiB"), std::string::npos) << r.output;
}

// ------------------------------------------------------------------------- integer flags

// The integer flags of a command, read from its own --help (CLI11 prints INT or UINT after an
// integer option), so that a flag added later is covered too.
struct IntegerFlag {
  std::string name;
  bool is_unsigned = false; // UINT: 2^63 fits, 2^64 does not
};
std::vector<IntegerFlag> integer_flags(const std::string& command) {
  const auto help = run_meshsim_in_process_exactly(command + " --help");
  std::vector<IntegerFlag> flags;
  const std::regex option(R"(^\s+(--[a-z][a-z0-9-]*)\s+(U?)INT\b)");
  std::istringstream lines(help.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, option)) flags.push_back({m[1], m[2] == "U"});
  }
  return flags;
}

TEST(CliBadInput, EveryIntegerFlagRefusesMinusOneAndTwoToTheSixtyThree) {
  const auto flags = integer_flags("plan");
  // The help lists them all: a parse that found none would pass vacuously.
  ASSERT_GE(flags.size(), 25u) << "found only " << flags.size() << " integer flags";
  for (const auto& [flag, is_unsigned] : flags) {
    // Past the field's type: 2^63 for a signed field, 2^64 for an unsigned one (the seed),
    // which takes 2^63 itself exactly.
    const std::string past = is_unsigned ? "18446744073709551616" : "9223372036854775808";
    for (const std::string& value : {std::string("-1"), past}) {
      const auto r = run_meshsim_in_process_exactly(plan_with(flag, value));
      expect_one_line_naming(r, value, {2}, flag + " " + value);
    }
    if (is_unsigned) {
      EXPECT_EQ(run_meshsim_in_process_exactly(plan_with(flag, "9223372036854775808")).code, 0) << flag;
    }
  }
}

// 0 is refused unless it means something the help says (no limit, keep all, all, the first
// seed, no ZeRO): those are listed here, and every other flag must refuse it.
TEST(CliBadInput, EveryIntegerFlagRefusesZeroUnlessZeroMeansSomething) {
  const std::set<std::string> zero_means_something = {
      "--max-steps", "--seed", "--checkpoint-every", "--keep-checkpoints", "--eval-limit", "--zero",
      "--moe-dense-layers"};
  for (const auto& [flag, is_unsigned] : integer_flags("plan")) {
    const auto r = run_meshsim_in_process_exactly(plan_with(flag, "0") + " --json");
    if (zero_means_something.count(flag)) {
      EXPECT_EQ(r.code, 0) << flag << " 0\n" << r.output;
    } else {
      expect_one_line_naming(r, "0", {2}, flag + " 0");
      EXPECT_NE(r.output.find(flag), std::string::npos) << flag << " 0 is not named\n" << r.output;
    }
  }
}

TEST(CliBadInput, PredictRefusesGpusZeroAndANegativeStep) {
  const StrangePaths& p = strange();
  for (const std::string flags : {"--gpus 0", "--gpus -1", "--step -1", "--step -5"}) {
    const auto r = run_meshsim_in_process_exactly("predict " + p.folder().string() + " --cluster 8xh100 " + flags);
    expect_one_line_naming(r, flags.substr(flags.find(' ') + 1), {2}, "predict " + flags);
  }
}

// ------------------------------------------------------------------------- size flags

// Every size flag past what a tensor, an int64 or the host can hold: one line, exit 2, before
// anything is allocated.
TEST(CliBadInput, EverySizeFlagRefusesItsOverflow) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--gpu-mem 99999999999999EiB", "99999999999999EiB"},
      {"--gpu-mem 17179869184GiB", "17179869184GiB"},
      {"--bucket-mb 1e300", "1e+300"},
      {"--seq-len 2000000000", "2000000000"},
      {"--seq-len 9223372036854775807", "9223372036854775807"},
      {"--hidden 4611686018427387904 --heads 1", "4611686018427387904"},
      {"--vocab 4611686018427387904", "4611686018427387904"},
      {"--batch-size 9223372036854775807", "9223372036854775807"},
      {"--global-batch-size 9223372036854775807", "9223372036854775807"},
      {"--micro-batch-size 9223372036854775807 --global-batch-size 8", "9223372036854775807"},
      {"--layers 1000000000", "1000000000"},
      {"--ffn-hidden 4611686018427387904", "4611686018427387904"},
  };
  for (const auto& [flags, value] : cases)
    for (const std::string& head : {std::string("train --data synthetic"), std::string("plan --cluster 1xh100")}) {
      CliResult r;
      const double s = seconds_of([&] { r = run_meshsim_in_process_exactly(small_gpt(head, flags)); });
      expect_one_line_naming(r, value, {2}, head + " " + flags);
      EXPECT_LT(s, 20) << head << " " << flags << " took " << s << " s";
    }
  const auto synthetic = run_meshsim_in_process("train --data synthetic --synthetic-train 9223372036854775807");
  expect_one_line_naming(synthetic, "9223372036854775807", {2, 4}, "--synthetic-train 2^63-1");
}

// --seq-len 2000000000 reached LibTorch's "Storage size calculation overflowed" (exit 1).
TEST(CliBadInput, ASequenceTooLongForATensorIsNamed) {
  const auto r = run_meshsim_exactly("plan --preset llama3-8b --cluster 8xh100 --seq-len 2000000000");
  expect_one_line_naming(r, "--seq-len 2000000000", {2}, "llama3-8b at 2e9 tokens");
  EXPECT_EQ(r.output.find("Storage size"), std::string::npos) << r.output;
}

// --layers 1000000000 ran until killed; 20,000 layers took 36 s.
TEST(CliBadInput, APlanTooLargeToRunIsRefusedBeforeItStarts) {
  for (const std::string layers : {"1000000000", "20000"}) {
    CliResult r;
    const double s = seconds_of(
        [&] { r = run_meshsim_exactly("plan --model gpt --cluster 8xh100 --layers " + layers); });
    expect_one_line_naming(r, "--layers " + layers, {2}, "--layers " + layers);
    EXPECT_LT(s, 10) << s << " s";
  }
  // So is one whose micro-batches make too many block passes.
  const auto r = run_meshsim_exactly("plan --model gpt --cluster 8xh100 --layers 96 "
                                     "--global-batch-size 1000000 --micro-batch-size 1");
  expect_one_line_naming(r, "block passes", {2}, "a million micro-batches");
}

// A plan whose GPUs would need more than any GPU has reported the sentinel it is held against
// as the capacity ("1073741824.00 GiB"). The eager core's [b, heads, s, s] scores at 4M tokens
// pass 1 EiB (the fused core's plan of the same needs 3.47 PiB).
TEST(CliBadInput, APlanFarTooLargeSaysSoWithoutASentinelCapacity) {
  const auto r = run_meshsim_exactly(
      "plan --preset llama3-8b --cluster 8xh100 --seq-len 4000000 --attention eager");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_EQ(r.output.find("1073741824"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("more than 1.00 EiB on one GPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fits: no"), std::string::npos) << r.output;
}

// ------------------------------------------------------------------------- --out

TEST(CliBadInput, EveryOutRefusesAFileAFolderWithFilesAndOneItCannotWrite) {
  const StrangePaths& p = strange();
  const std::vector<std::string> commands = {
      "train --data synthetic --max-steps 2 --no-progress", kPlanGpt,
      "plan --search " + kGpt + "--cluster 2xh100 --global-batch-size 4"};
  for (const std::string& command : commands) {
    const auto file = run_meshsim_in_process_exactly(command + " --out " + p.file.string());
    expect_one_line_naming(file, p.file.string(), {2}, command + " --out FILE");
    EXPECT_NE(file.output.find("is a file, not a folder"), std::string::npos) << file.output;
    const auto device = run_meshsim_in_process_exactly(command + " --out /dev/null");
    expect_one_line_naming(device, "/dev/null", {2}, command + " --out /dev/null");
    const auto below_file = run_meshsim_in_process_exactly(command + " --out " + (p.file / "run").string());
    expect_one_line_naming(below_file, (p.file / "run").string(), {2}, command + " --out FILE/run");
    for (const fs::path& odd : {p.fifo, p.dangling, p.loop}) {
      const auto r = run_meshsim_in_process_exactly(command + " --out " + odd.string());
      expect_one_line_naming(r, odd.string(), {2}, command + " --out " + odd.string());
    }
    const auto full = run_meshsim_in_process_exactly(command + " --out " + p.full().string());
    expect_one_line_naming(full, p.full().string(), {2}, command + " --out FULL");
    EXPECT_NE(full.output.find("not empty"), std::string::npos) << full.output;
  }
}

// A folder this user cannot write: as root (who writes anywhere) the command runs as nobody.
TEST(CliBadInput, AnOutFolderThatCannotBeWrittenIsRefusedBeforeAnyWork) {
  const fs::path dir = fresh_dir("locked");
  fs::create_directories(dir / "locked");
  ::chmod(dir.c_str(), 0755);
  ::chmod((dir / "locked").c_str(), 0555);
  std::string as;
  if (::geteuid() == 0) {
    if (std::system("command -v setpriv >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "running as root without setpriv: no user to be refused";
    as = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
    if (std::system((as + MESHSIM_BINARY + " info >/dev/null 2>&1").c_str()) != 0)
      GTEST_SKIP() << "user nobody cannot run " << MESHSIM_BINARY << " here";
  }
  for (const std::string& command :
       {std::string("train --data synthetic --max-steps 2 --no-progress"), kPlanGpt}) {
    const auto r = run_shell(as + MESHSIM_BINARY + " " + command + " --out " +
                               (dir / "locked" / "run").string());
    expect_one_line_naming(r, (dir / "locked").string(), {2}, command + " --out LOCKED/run");
    EXPECT_NE(r.output.find("not writable"), std::string::npos) << r.output;
  }
}

TEST(CliBadInput, PlanSearchWritesItsOut) {
  const fs::path out = fresh_dir("search-out");
  const auto r = run_meshsim_exactly("plan --search " + kGpt +
                                     "--cluster 2xh100 --global-batch-size 4 --top 3 --out " +
                                     out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto search = read_json(out / "search.json");
  EXPECT_FALSE(search["layouts"].empty()) << search.dump();
  // The fastest layout's plan, as `meshsim plan` with that layout writes it.
  const auto plan = read_json(out / "plan.json");
  EXPECT_EQ(plan["layout"], search["layouts"][0]["layout"]);
  EXPECT_TRUE(fs::exists(out / "trace.json"));
}

// ------------------------------------------------------------------------- export

TEST(CliBadInput, ExportIntoAMissingFolderOrAFolderNamesTheTarget) {
  const StrangePaths& p = strange();
  const fs::path missing = p.dir / "no-such-folder" / "model.pt";
  const auto r = run_meshsim_exactly("export " + p.folder().string() + " --state-dict " + missing.string());
  expect_one_line_naming(r, missing.string(), {2}, "--state-dict in a missing folder");
  EXPECT_EQ(r.output.find(".tmp-"), std::string::npos) << r.output;
  const auto folder = run_meshsim_exactly("export " + p.folder().string() + " --state-dict " +
                                          p.folder().string());
  expect_one_line_naming(folder, p.folder().string(), {2}, "--state-dict FOLDER");
  // A device, a FIFO or a dangling link is never written over (as root, a rename over
  // /dev/null would replace the device).
  for (const fs::path& target : {p.device, fs::path("/dev/null"), p.fifo, p.dangling}) {
    const auto r2 = run_meshsim_exactly("export " + p.folder().string() + " --state-dict " + target.string());
    expect_one_line_naming(r2, target.string(), {2}, "--state-dict " + target.string());
  }
  struct stat null {};
  ASSERT_EQ(::stat("/dev/null", &null), 0);
  EXPECT_TRUE(S_ISCHR(null.st_mode));
}

TEST(CliBadInput, ExportOfACheckpointOfAnotherModelIsDamagedData) {
  const fs::path a = fresh_dir("export-a"), b = fresh_dir("export-b");
  ASSERT_EQ(run_meshsim(kSmallTrain + "--max-steps 2 --out " + a.string()).code, 0);
  ASSERT_EQ(run_meshsim(kSmallTrain + "--model lenet --max-steps 2 --out " + b.string()).code, 0);
  fs::remove_all(a / "checkpoint");
  fs::copy(b / "checkpoint", a / "checkpoint", fs::copy_options::recursive);
  const auto r = run_meshsim_exactly("export " + a.string() + " --state-dict " + (a / "m.pt").string());
  expect_one_line_naming(r, "lenet", {3}, "a checkpoint of another model");
  EXPECT_NE(r.output.find("cannot export"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("cannot resume"), std::string::npos) << r.output;
  // Another model's weights under this run's manifest, its size and checksum made to match:
  // the manifest is whole, and still the part does not load. That was "cannot resume", exit 1.
  fs::remove_all(a / "checkpoint");
  ASSERT_EQ(run_meshsim(kSmallTrain + "--max-steps 2 --resume " + b.string() + " --out " +
                        (a / "ignored").string()).code, 2); // lenet's checkpoint is not a cnn's
  const fs::path c = fresh_dir("export-c");
  ASSERT_EQ(run_meshsim(kSmallTrain + "--max-steps 2 --out " + c.string()).code, 0);
  auto latest = [](const fs::path& run) {
    std::string name = read_text(run / "checkpoint" / "latest");
    name.erase(name.find_last_not_of(" \n") + 1);
    return run / "checkpoint" / name;
  };
  const fs::path step = latest(c);
  const std::string lenet = read_text(latest(b) / "model.pt");
  std::ofstream(step / "model.pt", std::ios::binary) << lenet;
  auto manifest = read_json(step / "manifest.json");
  manifest["parts"][0]["bytes"] = lenet.size();
  manifest["parts"][0]["crc32c"] = meshsim::crc32c(lenet.data(), lenet.size());
  std::ofstream(step / "manifest.json") << manifest.dump();
  const auto swapped = run_meshsim_exactly("export " + c.string() + " --state-dict " + (c / "m.pt").string());
  expect_one_line_naming(swapped, "does not fit the model its manifest names", {3}, "another model's part");
  EXPECT_NE(swapped.output.find("cannot export"), std::string::npos) << swapped.output;
}

// ------------------------------------------------------------------------- config.json

TEST(CliBadInput, ConfigWithADuplicateKeyOrANulIsRefused) {
  const fs::path dir = fresh_dir("config-dup");
  fs::create_directories(dir);
  std::ofstream(dir / "dup.json") << R"({"gpus": 2, "model": "cnn", "gpus": 4})";
  const auto dup = run_meshsim("train --config " + (dir / "dup.json").string());
  expect_one_line_naming(dup, "\"gpus\" appears twice", {2}, "a duplicate key");
  std::ofstream(dir / "nul.json") << R"({"strategy": "dd\u0000p-and-more"})";
  const auto nul = run_meshsim("train --config " + (dir / "nul.json").string());
  expect_one_line_naming(nul, "dd\\u0000p-and-more", {2}, "a NUL inside a string");
  EXPECT_NE(nul.output.find("control character"), std::string::npos) << nul.output;
}

// Found by fuzz/fuzz_cli (fuzz/corpus/fuzz_cli/crash-control-char-in-device): a text flag
// holding a carriage return was quoted raw, and the error was two lines.
TEST(CliBadInput, ATextFlagWithAControlCharacterIsOneLine) {
  for (const std::string flag : {"--device", "--strategy", "--cluster", "--out", "--data"}) {
    const auto r = run_meshsim_exactly("train " + flag + " \"$(printf 'a\\rb')\" --no-progress");
    expect_one_line_naming(r, flag + " 'a\\x0db' holds a control character", {2}, flag);
  }
}

// ------------------------------------------------------------------------- the cluster

TEST(CliBadInput, InterIsBlamedOnInter) {
  for (const std::string& command : {kPlanGpt.substr(0, kPlanGpt.find("--cluster")) + "--cluster 8xh100",
                                     std::string("train --data synthetic --cluster 8xh100")}) {
    const auto r = run_meshsim_in_process_exactly(command + " --inter 0xndr");
    expect_one_line_naming(r, "--inter \"0xndr\": NICs per node 0", {2}, command + " --inter 0xndr");
    EXPECT_EQ(r.output.find("cluster spec"), std::string::npos) << r.output;
  }
}

// ------------------------------------------------------------------------- predict's records

// A run folder whose records.json holds `edit` applied to a real run's records.
fs::path records_run(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  static const fs::path recorded = [] {
    const fs::path run = fresh_dir("records-source");
    EXPECT_EQ(run_meshsim(kSmallTrain + "--gpus 2 --max-steps 3 --out " + run.string()).code, 0);
    return run;
  }();
  const fs::path dir = fresh_dir("records-" + name);
  fs::create_directories(dir);
  nlohmann::json doc = read_json(recorded / "records.json");
  edit(doc);
  std::ofstream(dir / "records.json") << doc.dump();
  return dir;
}

TEST(CliBadInput, PredictRefusesImpossibleRecordsAsDamagedData) {
  using nlohmann::json;
  const std::vector<std::tuple<std::string, std::function<void(json&)>, std::string>> cases = {
      {"negative-flops", [](json& d) { d["ranks"][0]["compute"][1]["flops"] = -5e9; }, "flops is -5"},
      {"negative-samples", [](json& d) { d["samples_per_step"] = -64; }, "samples_per_step"},
      {"end-before-start",
       [](json& d) {
         auto& c = d["ranks"][0]["compute"][1];
         c["start_s"] = c["end_s"].get<double>() + 1;
       },
       "before it starts"},
      {"huge", [](json& d) { d["ranks"][1]["compute"][2]["flops"] = 1e308; }, "1e+308"},
      {"huge-bytes", [](json& d) { d["ranks"][0]["collectives"][0]["bytes"] = -1; }, "moves -1 bytes"},
      {"rank-outside", [](json& d) { d["ranks"][0]["collectives"][0]["group"] = {0, 7}; }, "names rank 7"},
      {"more-work-than-time",
       [](json& d) {
         for (auto& rank : d["ranks"])
           for (auto& c : rank["compute"]) {
             c["flops"] = c["flops"].get<double>() * 1e9; // regions' work, not their layers'
             c["layers"] = json::array();
           }
       },
       "MFU"},
  };
  for (const auto& [name, edit, expect] : cases) {
    const fs::path dir = records_run(name, edit);
    const auto r = run_meshsim_in_process_exactly("predict " + dir.string() + " --cluster 8xh100 --measured-compute");
    expect_one_line_naming(r, expect, {3}, name);
  }
  // A truncated file, cut inside a multi-byte character: exit 3, and the line stays printable.
  const fs::path cut = fresh_dir("records-cut");
  fs::create_directories(cut);
  std::ofstream(cut / "records.json") << "{\"format\": \"meshsim-records-1\", \"x\": \"\xc3";
  const auto r = run_meshsim_in_process_exactly("predict " + cut.string() + " --cluster 8xh100");
  expect_one_line_naming(r, "records.json", {3}, "a truncated records.json");
  EXPECT_EQ(r.output.find('\xc3'), std::string::npos) << "a raw byte in: " << r.output;
  EXPECT_NE(r.output.find("\\xc3"), std::string::npos) << r.output;
}

// ------------------------------------------------------------------------- lost outputs

// An out-of-memory at setup, in every strategy, keeps the instant it failed: memory.csv has
// a row with every GPU's bytes then, and memory.png is drawn from it.
TEST(CliBadInput, AnOutOfMemoryAtSetupKeepsMemoryCsvAndMemoryPng) {
  for (const std::string layout : {"--strategy ddp", "--strategy dp", "--zero 3", "--pp 2",
                                    "--strategy single --gpus 1"}) {
    const fs::path out = fresh_dir("oom-setup");
    const auto r = run_meshsim(kSmallTrain + layout + " --gpu-mem 1MiB --out " + out.string());
    ASSERT_EQ(r.code, 4) << layout << "\n" << r.output;
    std::istringstream csv(read_text(out / "memory.csv"));
    std::string header, row, rows;
    std::getline(csv, header);
    ASSERT_TRUE(static_cast<bool>(std::getline(csv, row))) << layout << ": memory.csv has only its header";
    // The GPU that ran out wrote its row; another GPU whose part fitted may have sampled its
    // "model" row before it (the ranks set up at once), so the row is looked for, not taken
    // to be the first.
    do rows += row + "\n";
    while (std::getline(csv, row));
    EXPECT_NE(rows.find("out of memory"), std::string::npos) << layout << "\n" << rows;
    if (picture_expected()) {
      EXPECT_TRUE(fs::exists(out / "memory.png")) << layout << "\n" << r.output;
    }
    EXPECT_EQ(read_json(out / "summary.json")["status"], "failed");
    fs::remove_all(out);
  }
}

// The host itself out of memory was `meshsim: std::bad_alloc`, exit 1; the README says 4.
TEST(CliBadInput, TheHostOutOfMemoryIsExit4) {
  if (kSanitizedBuild)
    GTEST_SKIP() << "a sanitizer's shadow memory needs more address space than the limit leaves";
  // 3 GiB of address space: LibTorch loads, and 5 million synthetic sequences (5 GiB, less
  // than half of what the host has, so not refused up front) do not fit.
  const auto r = run_shell("ulimit -v 3000000; " + std::string(MESHSIM_BINARY) +
                           " train --model gpt --layers 1 --hidden 16 --heads 2 --seq-len 64 "
                           "--vocab 256 --data synthetic --synthetic-train 5000000 --no-progress");
  if (r.code == 2 && r.output.find("more than half of this machine") != std::string::npos)
    GTEST_SKIP() << "this host has under 10 GiB available: " << r.output;
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("this machine ran out of memory"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// A mixture of experts that cannot be: each is one line naming what is wrong, exit 2, before
// anything is built.
TEST(CliBadInput, ImpossibleMixturesOfExpertsAreOneLine) {
  const std::string llama = "train --model llama --layers 2 --hidden 32 --heads 4 --seq-len 16 "
                            "--data synthetic --no-progress ";
  const struct {
    std::string flags, named;
  } cases[] = {
      {llama + "--moe-experts 4 --moe-top-k 5", "--moe-top-k 5"},
      {"train " + kGpt + "--data synthetic --moe-experts 4", "--moe-experts applies to --model llama"},
      {llama + "--moe-top-k 1", "give --moe-experts too"},
      {llama + "--moe-experts 4 --moe-router topk", "unknown --moe-router 'topk'"},
      {llama + "--moe-experts 4 --moe-dense-layers 2", "--moe-dense-layers 2"},
      {llama + "--moe-experts 4 --gpus 2 --tp 2 --sequence-parallel",
       "--moe-experts does not take --sequence-parallel"},
      {llama + "--moe-experts 6 --gpus 4 --ep 4", "--moe-experts 6 is not divisible by --ep 4"},
      {llama + "--moe-experts 4 --gpus 2 --ep 2 --moe-dispatch deep",
       "unknown --moe-dispatch 'deep' (choose deepep or alltoall)"},
      {llama + "--moe-experts 8 --moe-top-k 9", "--moe-top-k 9"},
      {llama + "--moe-experts 8 --gpus 4 --ep 8", "--ep 8 does not divide dp 4 × --cp 1 = 4"},
      {llama + "--moe-experts 8 --gpus 4 --tp 2 --ep 4", "--ep 4 does not divide dp 2 × --cp 1"},
      {llama + "--moe-experts 8 --gpus 8 --zero 1 --dp-shard 2 --ep 4",
       "--ep 4 does not divide --dp-shard 2 × --cp 1 = 2"},
      {llama + "--gpus 2 --ep 2", "--ep 2 splits a mixture of experts over ranks: it needs "
                                  "--moe-experts"},
      {"train --model cnn --gpus 2 --ep 2", "--ep 2 splits a mixture of experts"},
      {"plan --model llama --moe-imbalance 2 --cluster 8xh100",
       "--moe-routing and --moe-imbalance plan a mixture of experts: give --moe-experts"},
      {"plan --model llama --moe-experts 8 --moe-imbalance 9 --cluster 8xh100",
       "--moe-imbalance 9 must be between 1"},
      {"plan --model llama --moe-experts 8 --moe-routing /nonexistent --cluster 8xh100",
       "--moe-routing /nonexistent: no routing.csv there"},
      {"plan --model llama --moe-experts 6 --ep 4 --cluster 8xh100",
       "--moe-experts 6 is not divisible by --ep 4"},
      // DeepSeek-V3's multi-head latent attention: not over cp yet.
      {"plan --preset deepseek-v3 --gpus 16 --cp 2 --cluster 2x8xh800",
       "multi-head latent attention (from --hf-config) does not run with --cp 2"},
  };
  for (const auto& c : cases)
    expect_one_line_naming(run_meshsim_in_process_exactly(c.flags), c.named, {2}, c.flags);
}

} // namespace bad_input
