// `meshsim export RUN --state-dict FILE`: small runs of every layout are exported, loaded by
// Debian's python3-torch into PyTorch's own definition of the model (strict=True) and
// evaluated on the test data meshsim evaluated: the accuracy is meshsim's. The layouts of one
// GPT training the same global batch export the same tensors. A run without a checkpoint, and
// a damaged one, are one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <torch/serialize.h>

#include "cli_harness.h"
#include "data/dataset.h"
#include "data/text.h"
#include "../python_torch.h"
#include "train/export.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

// Every folder and file the tests make, removed when each test ends (CliExport::TearDown).
std::vector<fs::path> g_made;

// Test samples: those of the runs below (their --synthetic-test and --seed 0).
constexpr int64_t kTrain = 128, kTest = 64;

// Enough steps for the nets to learn (about 36% and 25% test accuracy), so that a model loaded
// wrongly would score otherwise.
const std::string kImages = "--data synthetic --synthetic-train 128 --synthetic-test 64 "
                            "--batch-size 16 --max-steps 8 ";
// SGD rather than Adam: two layouts' parameters then differ by their gradients' rounding
// alone (Adam's first steps divide by the gradient's own size, which rounding can flip). It
// barely moves the GPT from chance in 4 steps, so Adam runs (kGptAdam) are checked too.
const std::string kExportGpt = "--model gpt --data synthetic --synthetic-train 128 --synthetic-test 64 "
                         "--vocab 64 --hidden 32 --heads 4 --seq-len 16 --layers 2 --max-steps 4 "
                         "--optimizer sgd --lr 0.5 ";
const std::string kGptAdam = "--model gpt --data synthetic --synthetic-train 128 --synthetic-test "
                             "64 --vocab 64 --hidden 32 --heads 4 --seq-len 16 "
                             "--max-steps 8 --lr 0.01 ";
const std::string kGptShape = "2 32 4 16 64"; // reference_gpt.py: LAYERS HIDDEN HEADS SEQ VOCAB
const std::string kExportLlama = "--model llama --data synthetic --synthetic-train 128 "
                           "--synthetic-test 64 --vocab 64 --hidden 32 --heads 4 --kv-heads 2 "
                           "--ffn-hidden 48 --seq-len 16 --layers 2 --max-steps 4 "
                           "--optimizer sgd --lr 0.5 ";

// The test split a run of kImages / kGpt / kLlama evaluated, as torch.load reads it.
fs::path write_test_data(const std::string& model) {
  const meshsim::DataSplit data = model == "cnn" || model == "lenet"
                                      ? meshsim::synthetic_dataset(kTrain, kTest, 0)
                                      : meshsim::synthetic_text(kTrain, kTest, 16, 64, 0);
  meshsim::ExportedModel file;
  file.entries = {{"inputs", data.test.images.contiguous()},
                  {"targets", data.test.labels.contiguous()}};
  const std::string bytes = meshsim::state_dict_bytes(file);
  const fs::path path = fresh_dir("export-data-" + model) += ".pt";
  g_made.push_back(path);
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Trains `args` into a fresh folder and exports it; returns the state_dict's path.
fs::path train_and_export(const std::string& name, const std::string& args, int steps = 4) {
  const fs::path run = fresh_dir("export-" + name);
  g_made.push_back(run);
  const auto trained = run_meshsim("train " + args + " --out " + run.string());
  EXPECT_EQ(trained.code, 0) << name << "\n" << trained.output;
  const fs::path file = run / "model.pt";
  const auto exported =
      run_meshsim_exactly("export " + run.string() + " --state-dict " + file.string());
  EXPECT_EQ(exported.code, 0) << name << "\n" << exported.output;
  EXPECT_NE(exported.output.find("state_dict at step " + std::to_string(steps)), std::string::npos)
      << exported.output;
  return file;
}

// Exports to load into PyTorch's model, all in one python3 process (its start is most of the
// time), each checked against meshsim's accuracy. Predictions too close to call in float32
// (load_state_dict.py: the two best logits nearer than 8 times float32's measured error) may
// go either way: each moves the accuracy by 1/N.
class PyTorchChecks {
public:
  // `model`: the model and its shape, as load_state_dict.py takes them.
  void add(const std::string& name, const fs::path& state_dict, const fs::path& data,
           const std::string& model) {
    nlohmann::json job = {state_dict.string(), data.string()};
    std::istringstream words(model);
    for (std::string w; words >> w;)
      job.push_back(w);
    jobs_.push_back(job);
    names_.push_back(name);
    runs_.push_back(state_dict.parent_path());
  }

  void run() {
    const fs::path jobs = fresh_dir("export-jobs") += ".json";
    std::ofstream(jobs) << jobs_.dump();
    const std::string cmd = MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR
                            "/tests/models/load_state_dict.py " +
                            jobs.string() + " 2>&1";
    std::string out;
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;)
      out.append(buf, n);
    ASSERT_EQ(pclose(pipe), 0) << cmd << "\n" << out;
    fs::remove(jobs);
    std::istringstream lines(out);
    for (size_t i = 0; i < names_.size(); ++i) {
      std::string line;
      ASSERT_TRUE(std::getline(lines, line)) << out;
      expect_accuracy(names_[i], runs_[i], nlohmann::json::parse(line));
    }
  }

private:
  static void expect_accuracy(const std::string& name, const fs::path& run,
                              const nlohmann::json& got) {
    const double meshsim_accuracy = read_json(run / "summary.json")["test_accuracy"];
    const double n = got["predictions"], uncertain = got["uncertain"];
    const double pytorch_accuracy = got["accuracy"];
    EXPECT_LE(std::abs(pytorch_accuracy - meshsim_accuracy), (uncertain + 0.5) / n)
        << name << ": PyTorch " << pytorch_accuracy << ", meshsim " << meshsim_accuracy << ", "
        << uncertain << " of " << n << " predictions too close to call";
    std::printf("%-14s meshsim accuracy %.6f, PyTorch %.6f over %g predictions (%g too close "
                "to call), PyTorch test loss %.6f\n",
                name.c_str(), meshsim_accuracy, pytorch_accuracy, n, uncertain,
                got["loss"].get<double>());
  }

  nlohmann::json jobs_ = nlohmann::json::array();
  std::vector<std::string> names_;
  std::vector<fs::path> runs_;
};

std::vector<std::pair<std::string, at::Tensor>> read_state_dict(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : torch::pickle_load(bytes).toGenericDict())
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  return out;
}

// A layout that gathers a tensor wrongly (shards swapped, a stage's layers misplaced, ZeRO's
// flat buffer unpadded at the wrong place) moves whole rows or columns: an O(1) difference
// relative to the tensor. Summation order alone moves 4 SGD steps' parameters by about
// lr · steps · (reduction length ≤ 1024) · 2^-24 · |gradient| < 1e-4 of the tensor's scale.
void expect_same_tensors(const std::string& name, const fs::path& a, const fs::path& b) {
  const auto x = read_state_dict(a), y = read_state_dict(b);
  ASSERT_EQ(x.size(), y.size()) << name;
  double worst = 0; // the largest difference relative to its tolerance's scale
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].first, y[i].first) << name;
    ASSERT_TRUE(x[i].second.sizes().equals(y[i].second.sizes())) << name << " " << x[i].first;
    const double scale = x[i].second.abs().max().item<double>();
    const double diff = (x[i].second - y[i].second).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4 * std::max(scale, 1.0)) << name << " " << x[i].first;
    worst = std::max(worst, diff / std::max(scale, 1.0));
  }
  std::printf("%-14s %zu tensors equal the reference's within %.2g of their scale (bound 1e-4)\n",
              name.c_str(), x.size(), worst);
}

} // namespace

class CliExport : public ::testing::Test {
protected:
  void TearDown() override {
    for (const auto& path : g_made)
      fs::remove_all(path);
    g_made.clear();
  }
};

TEST_F(CliExport, CnnAndLenetLoadInPyTorch) {
  if (!python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  const fs::path data = write_test_data("cnn");
  PyTorchChecks checks;
  checks.add("cnn ddp", train_and_export("cnn", kImages + "--model cnn --gpus 2", 8), data, "cnn");
  checks.add("lenet ddp",
             train_and_export("lenet", kImages + "--model lenet --gpus 2 --lr 0.01", 8), data,
             "lenet");
  checks.run();
}

TEST_F(CliExport, GptLayoutsGatherTheSameStateDict) {
  if (!python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  const fs::path data = write_test_data("gpt");
  // One global batch of 8 sequences in every layout.
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"single", "--strategy single --gpus 1 --batch-size 8"},
      {"ddp", "--gpus 2 --batch-size 4"},
      {"tp2", "--gpus 2 --tp 2 --batch-size 8"},
      {"pp2", "--gpus 2 --pp 2 --micro-batches 2 --batch-size 8"},
      {"zero3", "--gpus 2 --zero 3 --batch-size 4"},
      {"dp2xtp2", "--gpus 4 --tp 2 --batch-size 4"},
  };
  PyTorchChecks checks;
  fs::path reference;
  for (const auto& [name, layout] : layouts) {
    const fs::path file = train_and_export("gpt-" + name, kExportGpt + layout);
    checks.add("gpt " + name, file, data, "gpt " + kGptShape + " 0 128");
    if (reference.empty())
      reference = file;
    else
      expect_same_tensors("gpt " + name, reference, file);
  }
  // A tied head is the embedding's wte, listed once, as PyTorch's state_dict lists it.
  const fs::path tied =
      train_and_export("gpt-tied", kExportGpt + "--gpus 2 --tp 2 --batch-size 8 --tie-head");
  checks.add("gpt tied tp2", tied, data, "gpt " + kGptShape + " 1 128");
  // Across a pipeline the last stage trains a copy of wte; the export holds one, the same.
  const fs::path tied_pp = train_and_export(
      "gpt-tied-pp2", kExportGpt + "--gpus 2 --pp 2 --micro-batches 2 --batch-size 8 --tie-head");
  checks.add("gpt tied pp2", tied_pp, data, "gpt " + kGptShape + " 1 128");
  expect_same_tensors("gpt tied pp2", tied, tied_pp);
  // Trained well enough (8% to 14% next-token accuracy, chance is 1.6%) that a wrongly
  // gathered tensor shows: heads over tp and layers over pp at once, and an interleaved
  // pipeline's chunks (rank 0 holds layers 0 and 2).
  checks.add("gpt tp2xpp2",
             train_and_export("gpt-adam",
                              kGptAdam + "--layers 2 --gpus 4 --tp 2 --pp 2 "
                                         "--micro-batches 2 --batch-size 8",
                              8),
             data, "gpt " + kGptShape + " 0 128");
  checks.add("gpt pp2 V=2",
             train_and_export("gpt-interleaved",
                              kGptAdam + "--layers 4 --gpus 2 --pp 2 "
                                         "--virtual-stages 2 --micro-batches 4 "
                                         "--batch-size 8",
                              8),
             data, "gpt 4 32 4 16 64 0 128");
  checks.run();
  for (const auto& [key, value] : read_state_dict(tied))
    EXPECT_NE(key, "head.weight");
  for (const auto& [key, value] : read_state_dict(tied_pp))
    EXPECT_NE(key, "head.weight");
}

TEST_F(CliExport, LlamaTensorParallelGathersHeadsAndKvHeads) {
  if (!python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  const fs::path data = write_test_data("llama");
  const std::string shape = "llama 2 32 4 2 48 64 10000";
  const fs::path single =
      train_and_export("llama-single", kExportLlama + "--strategy single --gpus 1 --batch-size 8");
  const fs::path tp = train_and_export("llama-tp2", kExportLlama + "--gpus 2 --tp 2 --batch-size 8");
  PyTorchChecks checks;
  checks.add("llama single", single, data, shape);
  checks.add("llama tp2", tp, data, shape);
  checks.run();
  expect_same_tensors("llama tp2", single, tp);
}

TEST_F(CliExport, MissingOrDamagedCheckpointsAreOneLineErrors) {
  const fs::path run = fresh_dir("export-errors");
  g_made.push_back(run);
  ASSERT_EQ(
      run_meshsim("train " + kExportGpt + "--gpus 2 --tp 2 --batch-size 8 --out " + run.string()).code,
      0);
  const fs::path out = run / "exported.pt";
  auto export_run = [&](const fs::path& dir) {
    return run_meshsim_exactly("export " + dir.string() + " --state-dict " + out.string());
  };

  auto r = run_meshsim_exactly("export " + run.string());
  EXPECT_EQ(r.code, 2) << r.output;
  r = export_run(run / "nowhere");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("nowhere is not a run folder: it does not exist"), std::string::npos)
      << r.output;
  fs::create_directories(run / "empty");
  r = export_run(run / "empty");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a run folder: it has no config.json"), std::string::npos)
      << r.output;

  // A flipped byte in a part: the checksum catches it, as a resume's does.
  const std::string step = read_text(run / "checkpoint" / "latest").substr(0, 13);
  const fs::path part = run / "checkpoint" / step / "rank-1.pt";
  std::string bytes = read_text(part);
  const std::string good = bytes;
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(part, std::ios::binary) << bytes;
  r = export_run(run);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("cannot export"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  std::ofstream(part, std::ios::binary) << good;
  r = export_run(run);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out));

  // A run folder without a checkpoint.
  const fs::path bare = fresh_dir("export-bare");
  g_made.push_back(bare);
  fs::create_directories(bare);
  fs::copy_file(run / "config.json", bare / "config.json");
  r = export_run(bare);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("has no checkpoint"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;

  std::ofstream(run / "config.json") << "{ not json";
  r = export_run(run);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("config.json is damaged"), std::string::npos) << r.output;
}
