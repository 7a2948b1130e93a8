// Tests for config.json read back (config_from_json) and `meshsim train --config FILE`: the
// round trip through to_json, one-line refusals naming the key, the limits validate enforces
// on values a file can hold, and the CLI's exit code for a bad file.
#include <fstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli/cli_harness.h"
#include "memory/category.h"
#include "config/byte_size.h"
#include "config/config.h"
#include "../train/error_of.h"

namespace meshsim {
namespace {

using nlohmann::json;

using testing::error_of;

json round_trip(const TrainConfig& config) {
  return to_json(config_from_json(to_json(config)));
}

TEST(ConfigFile, RoundTripIsIdentical) {
  TrainConfig plain;
  validate(plain);
  EXPECT_EQ(round_trip(plain).dump(), to_json(plain).dump());

  TrainConfig mesh;
  mesh.model = "gpt";
  mesh.gpus = 8;
  mesh.tp = 2;
  mesh.pp = 2;
  mesh.zero = 1;
  mesh.micro_batches = 4;
  mesh.precision = "bf16";
  mesh.sequence_parallel = true;
  mesh.global_batch_size = 32;
  mesh.shape = {3, 48, 6, 32, 300, false};
  mesh.data = "synthetic";
  mesh.seed = 18446744073709551615ULL; // the largest --seed
  mesh.optimizer.name = "sgd";
  mesh.optimizer.lr = 0.037;
  mesh.optimizer.momentum = 0.25;
  mesh.gpu_mem = "512MiB";
  mesh.bucket_mb = 0.5;
  mesh.comm_timeout_s = 2.5;
  mesh.checkpoint_every = 7;
  mesh.keep_checkpoints = 3;
  mesh.resume = "runs/a";
  mesh.cluster = "2x4xh100";
  mesh.inter = "hdr";
  validate(mesh);
  const json saved = to_json(mesh);
  EXPECT_EQ(round_trip(mesh).dump(), saved.dump());
  // What validate resolved stays resolved: the batch per replica, not the global batch.
  TrainConfig back = config_from_json(saved);
  EXPECT_EQ(back.batch_size, 16);
  EXPECT_EQ(back.global_batch_size, 0);
  EXPECT_TRUE(back.sequence_parallel);
  validate(back);
  EXPECT_EQ(to_json(back).dump(), saved.dump());
}

// The preset's name and the whole resolved shape (kv heads, MLP width, rope theta included)
// survive config.json, and validate accepts them again.
TEST(ConfigFile, RoundTripKeepsThePresetAndTheShape) {
  TrainConfig c;
  c.model = "gpt";
  c.preset = "gpt2";
  c.data = "synthetic";
  c.shape.layers = 1;
  c.shape.hidden = 48;
  c.shape.heads = 6;
  c.shape.kv_heads = 6;
  c.shape.ffn_hidden = 100;
  c.shape.seq_len = 16;
  c.shape.vocab = 300;
  c.shape.tie_head = true;
  c.shape.rope_theta = 123456.5;
  validate(c);
  const json saved = to_json(c);
  EXPECT_EQ(saved["preset"], "gpt2");
  EXPECT_EQ(saved["gpt"]["kv_heads"], 6);
  EXPECT_EQ(saved["gpt"]["ffn_hidden"], 100);
  EXPECT_EQ(saved["gpt"]["rope_theta"], 123456.5);
  EXPECT_EQ(round_trip(c).dump(), saved.dump());
  TrainConfig back = config_from_json(saved);
  EXPECT_EQ(back.preset, "gpt2");
  EXPECT_EQ(back.shape.ffn_hidden, 100);
  EXPECT_EQ(back.shape.rope_theta, 123456.5);
  validate(back);
  EXPECT_EQ(to_json(back).dump(), saved.dump());
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"preset", 7}});
            }),
            "config.json: \"preset\" must be a string, got number");
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"gpt", {{"rope_theta", "big"}}}});
            }),
            "config.json: \"gpt.rope_theta\" must be a number, got string");
}

TEST(ConfigFile, DerivedKeysAreIgnoredAndMissingKeysKeepDefaults) {
  const TrainConfig c =
      config_from_json(json{{"gpus", 2}, {"dp", 99}, {"global_batch_size", 1}, {"out", "runs/x"}});
  EXPECT_EQ(c.gpus, 2);
  const TrainConfig defaults;
  EXPECT_EQ(c.batch_size, defaults.batch_size);
  EXPECT_EQ(c.out, "");
  EXPECT_EQ(config_from_json(json::object()).model, "cnn");
}

TEST(ConfigFile, UnknownKeysAreRefusedByName) {
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"gpus", 2}, {"gpuz", 4}});
            }),
            "config.json: unknown key \"gpuz\"");
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"gpt", {{"layer", 2}}}});
            }),
            "config.json: unknown key \"gpt.layer\"");
  // A key holding a newline is escaped, so the message stays one line.
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"a\nb", 1}});
            }),
            "config.json: unknown key \"a\\nb\"");
  EXPECT_NE(error_of([] { config_from_json(json::array()); }).find("expected a JSON object"),
            std::string::npos);
}

TEST(ConfigFile, WrongTypesAreRefusedWithTheTypeExpected) {
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"gpus", "4"}});
            }),
            "config.json: \"gpus\" must be an integer from -2147483648 to 2147483647, got string");
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"lr", "fast"}});
            }),
            "config.json: \"lr\" must be a number, got string");
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"model", 1}});
            }),
            "config.json: \"model\" must be a string, got number");
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"gpt", {{"tie_head", 1}}}});
            }),
            "config.json: \"gpt.tie_head\" must be true or false, got number");
  EXPECT_EQ(error_of([] {
              config_from_json(json{{"gpt", 2}});
            }),
            "config.json: \"gpt\" must be an object, got number");
  // Floats and out-of-range integers are not cast (that would be undefined or wrap).
  EXPECT_NE(error_of([] {
              config_from_json(json{{"tp", 1e300}});
            }).find("\"tp\" must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              config_from_json(json{{"gpus", 4294967296LL}});
            }).find("\"gpus\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              config_from_json(json{{"seed", -1}});
            }).find("\"seed\" must be an integer from 0 to 18446744073709551615"),
            std::string::npos);
}

// Values a file (or a flag) can hold that used to overflow before validate refused them;
// fuzz/fuzz_config runs validate and to_json under UBSan.
TEST(ConfigFile, ValidateRefusesValuesThatWouldOverflow) {
  TrainConfig mesh;
  mesh.tp = 65536;
  mesh.pp = 65536; // tp × pp overflowed an int in ParallelDims
  EXPECT_NE(error_of([&] { validate(mesh); }).find("is not divisible by --tp 65536"),
            std::string::npos);
  TrainConfig batch;
  batch.batch_size = int64_t{1} << 62; // batch × dp overflowed in to_json and the messages
  EXPECT_NE(error_of([&] { validate(batch); }).find("--batch-size must be between 1 and"),
            std::string::npos);
  TrainConfig global;
  global.global_batch_size = int64_t{1} << 62;
  EXPECT_NE(error_of([&] { validate(global); }).find("--global-batch-size must be between 1 and"),
            std::string::npos);
}

// parse_bytes (config/byte_size.h) behind "gpu_mem": stod stopped at a second '.', so
// "1.2.3GiB" was taken as 1.2 GiB; and a control character broke the one-line message (found
// by fuzz/fuzz_size, fuzz/corpus/fuzz_size/crash-newline-in-message).
TEST(ConfigFile, SizesParseWithTheirUnits) {
  EXPECT_EQ(parse_bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_bytes("1MiB"), 1LL << 20);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000LL);
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_THROW(parse_bytes("lots"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("12XB"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("0MiB"), std::invalid_argument);
}

TEST(ConfigFile, GpuMemSizesAreParsedWhole) {
  EXPECT_EQ(parse_bytes("1.5GiB"), int64_t{3} << 29);
  EXPECT_NE(error_of([] { parse_bytes("1.2.3GiB"); }).find("expected a size"), std::string::npos);
  EXPECT_NE(error_of([] { parse_bytes("12\nMiB"); }).find("12\\x0aMiB"), std::string::npos);
  TrainConfig c = config_from_json(json{{"gpu_mem", "1..5GiB"}});
  EXPECT_NE(error_of([&] { validate(c); }).find("--gpu-mem: expected a size"), std::string::npos);
}

// ---------------------------------------------------------------- meshsim train --config

std::string write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
  return path.string();
}

TEST(ConfigFile, CliRefusesABadFileWithOneLineAndExit2) {
  const auto dir = testing::fresh_dir("config-file");
  const struct {
    std::string name, text, expect;
  } cases[] = {
      {"broken.json", "{\"gpus\": 4,", "not valid JSON"},
      {"unknown.json", "{\"gpuz\": 4}", "unknown key \"gpuz\""},
      {"type.json", "{\"gpus\": \"four\"}", "\"gpus\" must be an integer"},
  };
  for (const auto& c : cases) {
    const std::string path = write(dir / c.name, c.text);
    const auto r = testing::run_meshsim("train --config " + path);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "not one line: " << r.output;
  }
  const auto missing = testing::run_meshsim("train --config=" + (dir / "none.json").string());
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("cannot open"), std::string::npos) << missing.output;
  std::filesystem::remove_all(dir);
}

TEST(ConfigFile, CliFlagsOverrideTheFile) {
  const auto dir = testing::fresh_dir("config-override");
  // The file's value reaches validate...
  const std::string path = write(dir / "c.json", R"({"gpus": 3, "pp": 2})");
  const auto from_file = testing::run_meshsim("train --config " + path);
  EXPECT_EQ(from_file.code, 2) << from_file.output;
  EXPECT_NE(from_file.output.find("--gpus 3 is not divisible by --tp 1 × --pp 2"),
            std::string::npos)
      << from_file.output;
  // ...and a flag given on the command line replaces it.
  const auto overridden = testing::run_meshsim("train --config " + path + " --gpus 5");
  EXPECT_EQ(overridden.code, 2) << overridden.output;
  EXPECT_NE(overridden.output.find("--gpus 5 is not divisible"), std::string::npos)
      << overridden.output;
  std::filesystem::remove_all(dir);
}

TEST(ConfigFile, CliRerunFromARunFolderWritesTheSameConfig) {
  const auto dir = testing::fresh_dir("config-rerun");
  const auto first = testing::run_meshsim(
      "train --gpus 2 --optimizer sgd --lr 0.05 --data synthetic --synthetic-train 64 "
      "--synthetic-test 16 --batch-size 8 --max-steps 2 --out " +
      (dir / "a").string());
  ASSERT_EQ(first.code, 0) << first.output;
  // sgd without --lr would default to 0.01; the file's 0.05 must win.
  const auto again = testing::run_meshsim("train --config " + (dir / "a" / "config.json").string() +
                                          " --out " + (dir / "b").string());
  ASSERT_EQ(again.code, 0) << again.output;
  // Only "out" differs: each run writes its own folder.
  nlohmann::json a = testing::read_json(dir / "a" / "config.json");
  nlohmann::json b = testing::read_json(dir / "b" / "config.json");
  EXPECT_EQ(a.value("out", ""), (dir / "a").string());
  a.erase("out");
  b.erase("out");
  EXPECT_EQ(a, b);
  std::filesystem::remove_all(dir);
}

} // namespace
} // namespace meshsim
