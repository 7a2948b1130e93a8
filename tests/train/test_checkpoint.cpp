// Checkpoints that cannot be trusted are refused before a run starts; a full disk fails one
// checkpoint in one line and leaves nothing half-written; retention keeps the newest.
#include <gtest/gtest.h>

#include <fstream>

#include "../cli/cli_harness.h"
#include "data/dataset.h"
#include "base/crc32c.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"

using namespace meshsim;
using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

const std::string kCheckpointCnn = "train --data synthetic --synthetic-train 256 --synthetic-test 32 "
                         "--batch-size 16 --gpus 2 ";
const std::string kCheckpointGpt =
    "train --model gpt --data synthetic --synthetic-train 128 --synthetic-test 16 "
    "--layers 2 --hidden 32 --heads 4 --seq-len 16 --vocab 64 --batch-size 8 ";

CheckpointManifest two_rank_manifest() {
  CheckpointManifest m;
  m.step = 12;
  m.world_size = 2;
  m.identity = {kPerRankCheckpoint, "gpt (2 layers)", "adam", "2 GPUs as dp=2"};
  m.parts = {{"rank-0.pt", 0, 100, 0xdeadbeef}, {"rank-1.pt", 1, 200, 7}};
  return m;
}

std::string checkpoint_with(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos)
    text.replace(at, from.size(), to);
  return text;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

int lines_with(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

} // namespace

TEST(CheckpointManifest, RoundTripsAndRefusesWhatItDidNotWrite) {
  const CheckpointManifest m = two_rank_manifest();
  const std::string text = manifest_to_json(m);
  const CheckpointManifest back = parse_manifest(text);
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.world_size, 2);
  EXPECT_EQ(back.identity.layout, "2 GPUs as dp=2");
  ASSERT_EQ(back.parts.size(), 2u);
  EXPECT_EQ(back.parts[0].crc32c, 0xdeadbeefu);
  EXPECT_EQ(back.parts[1].bytes, 200);

  for (const auto& bad :
       {std::string("{"), std::string("[]"), checkpoint_with(text, "\"step\"", "\"stop\""),
        checkpoint_with(text, "meshsim checkpoint 1", "meshsim checkpoint 9"),
        checkpoint_with(text, "\"rank-1.pt\"", "\"../rank-1.pt\""), checkpoint_with(text, "\"rank\": 1", "\"rank\": 0"),
        checkpoint_with(text, "\"world_size\": 2", "\"world_size\": 3"),
        checkpoint_with(text, "\"bytes\": 200", "\"bytes\": -1"),
        checkpoint_with(text, "\"crc32c\": 7", "\"crc32c\": 4294967296"),
        checkpoint_with(text, "\"kind\": \"per-rank\"", "\"kind\": \"some\"")})
    EXPECT_THROW(parse_manifest(bad), DataError) << bad;
}

TEST(CheckpointManifest, PartBytesMustMatchSizeAndChecksum) {
  const std::string bytes = "a checkpoint part";
  const CheckpointPart part{"rank-0.pt", 0, static_cast<int64_t>(bytes.size()),
                            crc32c(bytes.data(), bytes.size())};
  EXPECT_NO_THROW(check_part_bytes(bytes, part));
  std::string flipped = bytes;
  flipped[5] ^= 0x10;
  EXPECT_THROW(check_part_bytes(flipped, part), DataError);
  EXPECT_THROW(check_part_bytes(bytes + "x", part), DataError);
}

// A byte flipped in model.pt, or a damaged manifest: exit 3 before anything runs, one line
// naming the checkpoint, and no run folder.
TEST(CheckpointIntegrity, DamagedCheckpointIsRefusedBeforeTheRun) {
  const auto run = fresh_dir("flip"), out = fresh_dir("flip-out");
  ASSERT_EQ(run_meshsim(kCheckpointCnn + "--max-steps 4 --out " + run.string()).code, 0);
  const fs::path step = run / "checkpoint" / "step-00000004";
  std::string bytes = read_text(step / "model.pt");
  ASSERT_GT(bytes.size(), 1000u);
  bytes[bytes.size() / 2] ^= 0x01;
  write_text(step / "model.pt", bytes);
  auto r = run_meshsim(kCheckpointCnn + "--max-steps 8 --resume " + run.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("model.pt fails its checksum"), std::string::npos) << r.output;
  EXPECT_EQ(lines_with(r.output, "meshsim:"), 1) << r.output;
  EXPECT_FALSE(fs::exists(out));

  write_text(step / "manifest.json", "{\"format\": \"meshsim checkpoint 1\", \"step\": ");
  r = run_meshsim(kCheckpointCnn + "--max-steps 8 --resume " + run.string() + " --out " + out.string());
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("manifest.json is damaged"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));

  r = run_meshsim(kCheckpointCnn + "--max-steps 8 --resume " + (run / "nothing-here").string() + " --out " +
                  out.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no checkpoint to resume"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(run);
}

// Per-rank parts swapped on disk fail their checksums; swapped together with their manifest
// entries, each part still says whose it is.
TEST(CheckpointIntegrity, SwappedPartsAreRefused) {
  const auto run = fresh_dir("swap"), out = fresh_dir("swap-out");
  ASSERT_EQ(run_meshsim(kCheckpointGpt + "--gpus 2 --zero 1 --max-steps 2 --out " + run.string()).code, 0);
  const fs::path step = run / "checkpoint" / "step-00000002";
  const std::string a = read_text(step / "rank-0.pt"), b = read_text(step / "rank-1.pt");
  write_text(step / "rank-0.pt", b);
  write_text(step / "rank-1.pt", a);
  const std::string resume =
      kCheckpointGpt + "--gpus 2 --zero 1 --max-steps 4 --resume " + run.string() + " --out " + out.string();
  auto r = run_meshsim(resume);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("rank-0.pt"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));

  CheckpointManifest m = parse_manifest(read_text(step / "manifest.json"));
  std::swap(m.parts[0].bytes, m.parts[1].bytes);
  std::swap(m.parts[0].crc32c, m.parts[1].crc32c);
  write_text(step / "manifest.json", manifest_to_json(m));
  r = run_meshsim(resume);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("rank-0.pt holds rank 1's part, not rank 0's"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(run);
}

TEST(CheckpointIntegrity, AnotherOptimizerOrModelIsRefused) {
  const auto run = fresh_dir("variant"), out = fresh_dir("variant-out");
  ASSERT_EQ(
      run_meshsim(kCheckpointGpt + "--gpus 2 --max-steps 2 --optimizer adam --out " + run.string()).code, 0);
  auto r = run_meshsim(kCheckpointGpt + "--gpus 2 --max-steps 4 --optimizer sgd --resume " + run.string() +
                       " --out " + out.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("its optimizer state is adam's; this run uses --optimizer sgd"),
            std::string::npos)
      << r.output;
  r = run_meshsim(kCheckpointGpt + "--gpus 2 --max-steps 4 --tie-head --resume " + run.string() + " --out " +
                  out.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("it holds the model gpt (2 layers, hidden 32, 4 heads, 16 tokens, "
                          "vocabulary 64, untied head); this run trains gpt (2 layers, hidden 32, "
                          "4 heads, 16 tokens, vocabulary 64, tied head)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(run);
}

// The shape flags that presets brought (MLP width, kv heads, rope theta) are part of the
// identity a resume checks; a gpt of the default width keeps the identity it always had.
TEST(CheckpointIntegrity, IdentityNamesEveryShapeField) {
  TrainConfig gpt;
  gpt.model = "gpt";
  EXPECT_EQ(checkpoint_identity(gpt).model,
            "gpt (2 layers, hidden 64, 4 heads, 64 tokens, vocabulary 256, untied head)");
  gpt.shape.ffn_hidden = 100;
  EXPECT_EQ(checkpoint_identity(gpt).model,
            "gpt (2 layers, hidden 64, 4 heads, 64 tokens, vocabulary 256, untied head, MLP 100)");
  TrainConfig llama;
  llama.model = "llama";
  llama.shape.kv_heads = 2;
  llama.shape.rope_theta = 500000;
  EXPECT_EQ(checkpoint_identity(llama).model,
            "llama (2 layers, hidden 64, 4 heads, 64 tokens, vocabulary 256, untied head, 2 kv "
            "heads, MLP 256, rope theta 500000)");
}

TEST(CheckpointIntegrity, KeepCheckpointsKeepsTheNewest) {
  const auto run = fresh_dir("keep");
  ASSERT_EQ(run_meshsim(kCheckpointCnn + "--max-steps 10 --checkpoint-every 2 --keep-checkpoints 2 --out " +
                        run.string())
                .code,
            0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run / "checkpoint"))
    names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000008", "step-00000010"}));
  EXPECT_EQ(read_text(run / "checkpoint" / "latest"), "step-00000010\n");
  fs::remove_all(run);
}

// The run folder on a 1 MiB file system (a private tmpfs mount): the first checkpoint does
// not fit. The run fails in one line with exit 1, writes its failed summary, and leaves no
// temporary file or folder.
TEST(CheckpointIntegrity, AFullDiskFailsInOneLineAndLeavesNothingHalfWritten) {
  std::string unshare;
  for (const char* how : {"unshare -m", "unshare -Urm"})
    if (std::system((std::string(how) + " true >/dev/null 2>&1").c_str()) == 0) {
      unshare = how;
      break;
    }
  if (unshare.empty())
    GTEST_SKIP() << "no private mount namespace here (unshare -m and -Urm fail)";
  const auto mnt = fresh_dir("full");
  fs::create_directories(mnt);
  const fs::path run = mnt / "run";
  const fs::path script = mnt.string() + ".sh";
  write_text(script, "mount -t tmpfs -o size=1m meshsim-full " + mnt.string() + " || exit 97\n" +
                         MESHSIM_BINARY + " " + kCheckpointCnn +
                         "--max-steps 4 --checkpoint-every 2 --no-progress --out " + run.string() +
                         "\necho \"exit=$?\"\necho \"left: $(ls -A " +
                         (run / "checkpoint").string() + " | tr '\\n' ' ')\"\ncat " +
                         (run / "summary.json").string() + "\n");
  CliResult r;
  {
    const std::string cmd = unshare + " sh " + script.string() + " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0)
      r.output.append(buf, n);
    r.code = pclose(pipe);
  }
  fs::remove(script);
  if (r.output.find("exit=") == std::string::npos)
    GTEST_SKIP() << "cannot mount a tmpfs: " << r.output;
  EXPECT_NE(r.output.find("exit=1"), std::string::npos) << r.output;
  EXPECT_EQ(lines_with(r.output, "No space left on device"), 2) << r.output; // console + summary
  EXPECT_NE(r.output.find("left: \n"), std::string::npos) << r.output; // nothing in checkpoint/
  EXPECT_NE(r.output.find("\"status\": \"failed\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"exit_code\": 1"), std::string::npos) << r.output;
  fs::remove_all(mnt);
}
