// The Hugging Face format both ways. `meshsim export RUN --hf DIR` of a `--tp 2 --pp 2` Llama
// and a `--zero 3` GPT (and a tied GPT) is loaded by transformers' AutoModelForCausalLM, which
// computes meshsim's loss on the same tokens; `meshsim train --init-from DIR` in the same
// layout computes it too, and exports the very bytes it started from, as it does from the
// folder transformers' save_pretrained writes again. A folder that does not fit the run is
// one line before anything trains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <numeric>

#include <torch/serialize.h>

#include "../python_torch.h"
#include "base/safetensors.h"
#include "cli_harness.h"
#include "data/dataset.h"
#include "data/text.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

// Both models read the same synthetic tokens: 128 training samples of 16 tokens from a
// vocabulary of 64 (seed 0), which every layout below covers in whole batches, no sample
// twice, in one epoch.
constexpr int64_t kHfTrain = 128, kHfSeq = 16, kHfVocab = 64;
const std::string kHfData = "--data synthetic --synthetic-train 128 --synthetic-test 64 "
                            "--seq-len 16 --vocab 64 ";

struct HfCase {
  std::string name, model, flags, layout;
  std::string reference_shape;   // hf_check.py's shape arguments
  int64_t layers, hidden, heads; // for the tolerance
  int64_t ffn;
  bool rotary;
  int64_t epoch_steps; // one epoch of kHfTrain samples in this layout
};

const HfCase kHfLlama{
    "llama-tp2-pp2",
    "llama",
    "--model llama --hidden 32 --heads 4 --kv-heads 2 --ffn-hidden 48 --layers 2 ",
    "--gpus 4 --tp 2 --pp 2 --micro-batches 2 --batch-size 16 ",
    "2 32 4 2 48 64 10000",
    2,
    32,
    4,
    48,
    true,
    8};
const HfCase kHfGptZero{"gpt-zero3",
                        "gpt",
                        "--model gpt --hidden 32 --heads 4 --layers 2 --no-tie-head ",
                        "--gpus 4 --zero 3 --batch-size 8 ",
                        "2 32 4 16 64 0 128",
                        2,
                        32,
                        4,
                        128,
                        false,
                        4};
const HfCase kHfGptTied{"gpt-tied-ddp",
                        "gpt",
                        "--model gpt --hidden 32 --heads 4 --layers 2 --tie-head ",
                        "--gpus 2 --batch-size 16 ",
                        "2 32 4 16 64 1 128",
                        2,
                        32,
                        4,
                        128,
                        false,
                        4};

// The training split every run above reads, as torch.load reads it.
fs::path write_hf_train_data() {
  const meshsim::DataSplit data = meshsim::synthetic_text(kHfTrain, 64, kHfSeq, kHfVocab, 0);
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("inputs", data.train.images);
  dict.insert("targets", data.train.labels);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  const fs::path path = fresh_dir("hf-data") += ".pt";
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// How far a float32 evaluation of the loss may be from the exact one, to first order. Every
// value on the way from the tokens to the loss is a reduction, and a float32 sum of n terms is
// off by at most n·u (u = 2^-24) relative to the sum of their sizes (Higham, Accuracy and
// Stability, Thm 3.1): along the longest chain, each block's norm (2h: mean and variance),
// q·kᵀ (head size d), softmax and its weighted sum (T keys each), the output projection (h),
// the second norm (2h), the MLP (h in, F out), with the rotary tables (angle p·θ^(-i/d) for
// p < T: 4T rounding steps) on q and k; then the last norm (2h), the head (h), log-sum-exp (V)
// and the mean over the tokens. The logits move by at most N·u·|z|max, and the cross-entropy
// by at most twice what its largest logit moves (its gradient's 1-norm is at most 2); the mean
// of the tokens' losses adds (tokens)·u of the loss.
double loss_bound(const HfCase& c, double max_abs_logit, int64_t tokens, double loss,
                  double u = std::ldexp(1.0, -24)) {
  const double h = static_cast<double>(c.hidden), d = h / static_cast<double>(c.heads);
  const double T = kHfSeq, V = kHfVocab;
  const double block =
      2 * h + d + 2 * T + h + 2 * h + h + static_cast<double>(c.ffn) + (c.rotary ? 2 * 4 * T : 0);
  const double N = static_cast<double>(c.layers) * block + 2 * h + h + V;
  return 2 * N * u * std::max(max_abs_logit, 1.0) + static_cast<double>(tokens) * u * loss;
}

// Trains `c` for 6 Adam steps and exports it both ways; returns the folder and state_dict.
std::pair<fs::path, fs::path> train_and_export_hf(const HfCase& c) {
  const fs::path run = fresh_dir("hf-" + c.name);
  const auto trained = run_meshsim("train " + c.flags + kHfData + c.layout +
                                   "--max-steps 6 --lr 0.01 --out " + run.string());
  EXPECT_EQ(trained.code, 0) << c.name << "\n" << trained.output;
  const fs::path hf = run / "hf", state = run / "model.pt";
  const auto exported = run_meshsim_exactly("export " + run.string() + " --hf " + hf.string() +
                                            " --state-dict " + state.string());
  EXPECT_EQ(exported.code, 0) << exported.output;
  EXPECT_NE(exported.output.find("at step 6 (config.json, model.safetensors"), std::string::npos)
      << exported.output;
  return {hf, state};
}

// One epoch from `hf` at --lr 0 (the weights stay as loaded), in `c`'s layout: every step's
// loss; and the folder its export writes.
std::pair<std::vector<double>, fs::path> measure_from(const HfCase& c, const fs::path& hf,
                                                      const std::string& tag) {
  const fs::path run = fresh_dir("hf-init-" + c.name + tag);
  const auto trained = run_meshsim("train " + c.flags + kHfData + c.layout + "--init-from " +
                                   hf.string() + " --lr 0 --log-every 1 --out " + run.string());
  EXPECT_EQ(trained.code, 0) << c.name << "\n" << trained.output;
  const auto exported =
      run_meshsim_exactly("export " + run.string() + " --hf " + (run / "hf").string());
  EXPECT_EQ(exported.code, 0) << exported.output;
  return {run_losses(run), run / "hf"};
}

bool transformers_available() {
  static const bool available = python_runs("import transformers, safetensors, torch");
  return available;
}

} // namespace

TEST(CliHf, TransformersComputesMeshsimsLossAndInitFromRoundTrips) {
  if (!transformers_available())
    GTEST_SKIP() << MESHSIM_PYTHON " cannot import transformers and safetensors (make test-torch2)";
  const fs::path data = write_hf_train_data();
  const std::vector<HfCase> cases{kHfLlama, kHfGptZero, kHfGptTied};
  nlohmann::json jobs = nlohmann::json::array();
  std::vector<fs::path> folders;
  for (const auto& c : cases) {
    const auto [hf, state] = train_and_export_hf(c);
    folders.push_back(hf);
    std::vector<std::string> shape;
    std::istringstream words(c.reference_shape);
    for (std::string w; words >> w;)
      shape.push_back(w);
    jobs.push_back({{"hf", hf.string()},
                    {"state_dict", state.string()},
                    {"data", data.string()},
                    {"model", c.model},
                    {"shape", shape},
                    {"resave", (hf.parent_path() / "resaved").string()}});
  }
  const fs::path job_file = fresh_dir("hf-jobs") += ".json";
  std::ofstream(job_file) << jobs.dump();
  const fs::path log = fresh_dir("hf-python-log") += ".txt";
  const std::string cmd = MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR "/tests/cli/hf_check.py " +
                          job_file.string() + " 2>" + log.string();
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;)
    out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd << "\n" << out << "\n" << read_text(log);
  std::istringstream lines(out);
  for (size_t i = 0; i < cases.size(); ++i) {
    const HfCase& c = cases[i];
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << out;
    const auto got = nlohmann::json::parse(line);
    EXPECT_TRUE(got["loading_problems"].empty()) << c.name << ": " << line;
    EXPECT_EQ(got["architecture"], c.model == "gpt" ? "GPT2LMHeadModel" : "LlamaForCausalLM");
    EXPECT_EQ(got["dtype"], "torch.float32");

    // meshsim from the folder, in the layout that wrote it.
    const auto [losses, again] = measure_from(c, folders[i], "");
    ASSERT_EQ(static_cast<int64_t>(losses.size()), c.epoch_steps) << c.name;
    // Every step's batch is the same size: their mean is the mean over every token.
    const double meshsim_loss =
        std::accumulate(losses.begin(), losses.end(), 0.0) / static_cast<double>(losses.size());
    const double hf64 = got["hf64"], hf32 = got["hf32"], ref64 = got["ref64"];
    const double zmax = got["max_abs_logit"];
    const int64_t tokens = got["tokens"];
    const double tol32 = loss_bound(c, zmax, tokens, hf64);
    // float64 on both sides: the same bound with u = 2^-53; PyTorch's twin of meshsim's model
    // (reference_*.py, which the model tests hold meshsim to) and transformers' model agree
    // on every logit, so the names, transposes and config.json fields map exactly.
    const double tol64 = loss_bound(c, zmax, tokens, hf64, std::ldexp(1.0, -53));
    EXPECT_LE(got["logits_ref64_vs_hf64"].get<double>(), tol64) << c.name << ": " << line;
    EXPECT_LE(std::abs(ref64 - hf64), tol64) << c.name;
    EXPECT_LE(std::abs(hf32 - hf64), tol32) << c.name;
    EXPECT_LE(std::abs(meshsim_loss - hf64), tol32) << c.name;
    std::printf("%-13s meshsim %.9f  transformers fp32 %.9f fp64 %.12f  |meshsim-fp64| %.2e "
                "(bound %.2e)  |ref64-hf64| logits %.2e (bound %.2e)\n",
                c.name.c_str(), meshsim_loss, hf32, hf64, std::abs(meshsim_loss - hf64), tol32,
                got["logits_ref64_vs_hf64"].get<double>(), tol64);

    // Back out, byte for byte: from meshsim's own folder, and from transformers' resave.
    EXPECT_EQ(read_bytes(again / "model.safetensors"), read_bytes(folders[i] / "model.safetensors"))
        << c.name;
    EXPECT_EQ(read_bytes(again / "config.json"), read_bytes(folders[i] / "config.json")) << c.name;
    const auto [resaved_losses, from_resaved] =
        measure_from(c, folders[i].parent_path() / "resaved", "-resaved");
    // The same weights (the bytes below): the same loss, to float32's rounding of the run.
    ASSERT_EQ(resaved_losses.size(), losses.size()) << c.name;
    EXPECT_LE(std::abs(std::accumulate(resaved_losses.begin(), resaved_losses.end(), 0.0) /
                           static_cast<double>(losses.size()) -
                       hf64),
              tol32)
        << c.name;
    EXPECT_EQ(read_bytes(from_resaved / "model.safetensors"),
              read_bytes(folders[i] / "model.safetensors"))
        << c.name;
  }
}

namespace {

// A copy of the folder `from` at `to` whose model.safetensors `edit` changed.
void edited_copy(const fs::path& from, const fs::path& to,
                 const std::function<void(std::vector<meshsim::SafetensorsTensor>&)>& edit) {
  fs::create_directories(to);
  fs::copy_file(from / "config.json", to / "config.json", fs::copy_options::overwrite_existing);
  meshsim::SafetensorsFile file = meshsim::read_safetensors((from / "model.safetensors").string());
  edit(file.tensors);
  std::ofstream(to / "model.safetensors", std::ios::binary)
      << meshsim::safetensors_bytes(file.tensors, file.metadata);
}

meshsim::SafetensorsTensor& tensor_named(std::vector<meshsim::SafetensorsTensor>& tensors,
                                         const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name)
      return t;
  throw std::invalid_argument("no " + name);
}

} // namespace

// Every way a folder can fail to fit the run: one line, the exit code of its kind (2 the flags,
// 3 a damaged file), and no run folder, before anything trains.
TEST(CliHf, AFolderThatDoesNotFitIsOneLineBeforeTraining) {
  const fs::path run = fresh_dir("hf-errors");
  const std::string gpt_shape = "--model gpt --hidden 32 --heads 4 --no-tie-head " + kHfData;
  const std::string gpt = gpt_shape + "--layers 2 ";
  ASSERT_EQ(run_meshsim("train " + gpt + "--gpus 2 --max-steps 1 --out " + run.string()).code, 0);
  const fs::path hf = run / "hf";
  ASSERT_EQ(run_meshsim_exactly("export " + run.string() + " --hf " + hf.string()).code, 0);
  const std::string c_attn = "transformer.h.0.attn.c_attn.weight";
  edited_copy(hf, run / "missing", [](auto& t) {
    t.erase(std::find_if(t.begin(), t.end(),
                         [](const auto& x) { return x.name == "transformer.ln_f.bias"; }));
  });
  edited_copy(hf, run / "dtype",
              [](auto& t) { tensor_named(t, "transformer.ln_f.bias").dtype = "I32"; });
  edited_copy(hf, run / "shape", [&](auto& t) { tensor_named(t, c_attn).shape = {96, 32}; });
  edited_copy(hf, run / "extra", [](auto& t) {
    t.push_back({"transformer.extra.weight", "F32", {1}, std::string(4, '\0')});
  });
  fs::create_directories(run / "truncated");
  fs::copy_file(hf / "config.json", run / "truncated" / "config.json");
  const std::string bytes = read_bytes(hf / "model.safetensors");
  std::ofstream(run / "truncated" / "model.safetensors", std::ios::binary)
      << bytes.substr(0, bytes.size() - 5);
  fs::create_directories(run / "badjson");
  fs::copy_file(hf / "model.safetensors", run / "badjson" / "model.safetensors");
  std::ofstream(run / "badjson" / "config.json") << "{\"n_layer\": 2,";

  const struct {
    std::string args;
    int code;
    std::string message;
  } cases[] = {
      {gpt_shape + "--layers 3 --init-from " + hf.string(), 2,
       "config.json's n_layer is 2; this run's --layers is 3"},
      {gpt + "--ffn-hidden 64 --init-from " + hf.string(), 2,
       "config.json's n_inner is 128; this run's --ffn-hidden is 64"},
      {"--model gpt --hidden 32 --heads 4 --layers 2 --tie-head " + kHfData + "--init-from " +
           hf.string(),
       2, "config.json's tie_word_embeddings is false; this run has --tie-head"},
      {"--model llama --hidden 32 --heads 4 --layers 2 " + kHfData + "--init-from " + hf.string(),
       2, "config.json's model_type is \"gpt2\"; this run's --model llama is llama"},
      {gpt + "--init-from " + (run / "missing").string(), 2,
       "model.safetensors has no tensor transformer.ln_f.bias"},
      {gpt + "--init-from " + (run / "dtype").string(), 2,
       "tensor transformer.ln_f.bias is I32; meshsim reads weights in F32, BF16, F16 or F64"},
      {gpt + "--init-from " + (run / "shape").string(), 2,
       "tensor " + c_attn + " is [96, 32]; this run's model has [32, 96]"},
      {gpt + "--init-from " + (run / "extra").string(), 2,
       "holds a tensor transformer.extra.weight that this run's model has not"},
      {gpt + "--init-from " + (run / "truncated").string(), 3,
       "model.safetensors: its tensors hold"},
      {gpt + "--init-from " + (run / "badjson").string(), 3, "config.json is damaged"},
      {gpt + "--init-from " + run.string(), 2, "has no model.safetensors"},
      {gpt + "--init-from " + (run / "nothing").string(), 2, "it does not exist"},
      {"--model cnn --data synthetic --init-from " + hf.string(), 2,
       "--init-from reads the Hugging Face folders of gpt and llama; cnn has none"},
  };
  for (const auto& c : cases) {
    const fs::path out = run / "never";
    const auto r = run_meshsim("train " + c.args + " --out " + out.string());
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  const auto neither = run_meshsim_exactly("export " + run.string());
  EXPECT_EQ(neither.code, 2) << neither.output;
  EXPECT_NE(neither.output.find("export needs --state-dict FILE (PyTorch) or --hf DIR"),
            std::string::npos)
      << neither.output;
}
