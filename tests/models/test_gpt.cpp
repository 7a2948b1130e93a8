// The GPT against PyTorch itself (same seed, same logits), its parameter count against the
// formula, tied-head deduplication, and activation checkpointing: same loss and gradients,
// less peak activation memory on a virtual GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <iostream>

#include "data/text.h"
#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/gpt.h"
#include "parallel/strategy.h"
#include "../python_torch.h"

using namespace meshsim;
using meshsim::testing::python_torch_available;

namespace {

TransformerShape small_gpt(bool tie) {
  TransformerShape o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.seq_len = 16;
  o.vocab = 64;
  o.tie_head = tie;
  return o;
}

// The same fixed tokens reference_gpt.py uses.
torch::Tensor fixed_tokens(int64_t batch, int64_t t, int64_t vocab) {
  torch::Tensor tokens = torch::empty({batch, t}, torch::kLong);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < t; ++i)
      tokens[b][i] = (7 * b + 13 * i + 3) % vocab;
  return tokens;
}

// Runs reference_gpt.py: the parameter count, then every logit.
std::vector<double> python_reference(const TransformerShape& o, int seed, int64_t batch, int64_t t) {
  const std::string cmd = MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR "/tests/models/reference_gpt.py " +
                          std::to_string(o.layers) + " " + std::to_string(o.hidden) + " " +
                          std::to_string(o.heads) + " " + std::to_string(o.seq_len) + " " +
                          std::to_string(o.vocab) + " " + std::to_string(o.tie_head ? 1 : 0) + " " +
                          std::to_string(seed) + " " + std::to_string(batch) + " " +
                          std::to_string(t) + " " + std::to_string(gpt_ffn_hidden(o));
  return meshsim::testing::numbers_printed_by(cmd);
}

struct LossAndGrads {
  double loss = 0;
  std::vector<torch::Tensor> grads;
};

LossAndGrads loss_and_grads(torch::nn::Sequential& model, const Dataset& data) {
  torch::Tensor loss = loss_fn(model->forward(data.images), data.labels);
  loss.backward();
  LossAndGrads out{loss.item<double>(), {}};
  GpuGuard host(nullptr);
  for (const auto& p : unique_parameters(*model))
    out.grads.push_back(p.grad().clone());
  return out;
}

// One forward and backward of a 4-block GPT on a one-GPU mesh; returns the peak bytes the
// virtual GPU held as activations, and the loss and gradients.
int64_t peak_activations(Recompute recompute, LossAndGrads& result) {
  MeshOptions mo;
  mo.world_size = 1;
  mo.capacity_bytes = int64_t{1} << 30;
  DeviceMesh mesh(mo);
  TransformerShape o;
  o.layers = 4;
  o.seq_len = 64;
  const Dataset data = synthetic_text(8, 0, 64, 256, 11).train;
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::nn::Sequential model;
    {
      CategoryScope params(MemoryCategory::Parameters);
      model = build_model("gpt", ModelOptions{5, 0, o});
    }
    set_recompute(model, recompute);
    allocate_gradients(unique_parameters(*model)); // .grad under gradients, not activations
    CategoryScope acts(MemoryCategory::Activations);
    result = loss_and_grads(model, data);
  });
  return mesh.gpu(0).stats().peak_by_category[static_cast<size_t>(MemoryCategory::Activations)];
}

} // namespace

TEST(GptModel, LogitsAndParameterCountMatchPyTorch) {
  if (!python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  for (int variant : {0, 1, 2}) { // untied, tied, untied with an MLP width other than 4H
    const bool tie = variant == 1;
    TransformerShape o = small_gpt(tie);
    if (variant == 2)
      o.ffn_hidden = 48;
    const int64_t batch = 2, t = 12; // T < seq_len: positions are a prefix of wpe
    const auto expected = python_reference(o, 3, batch, t);
    ASSERT_EQ(expected.size(), static_cast<size_t>(1 + batch * t * o.vocab))
        << "variant " << variant;
    auto model = build_model("gpt", ModelOptions{3, 0, o});
    EXPECT_EQ(count_parameters(*model), static_cast<int64_t>(expected[0])) << "variant " << variant;
    EXPECT_EQ(gpt_parameter_count(o), static_cast<int64_t>(expected[0])) << "variant " << variant;
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model->forward(fixed_tokens(batch, t, o.vocab)).reshape(-1);
    const torch::Tensor reference =
        torch::tensor(std::vector<double>(expected.begin() + 1, expected.end()));
    const double max_diff = (logits.to(torch::kFloat64) - reference).abs().max().item<double>();
    EXPECT_LT(max_diff, 1e-5) << "variant " << variant;
    std::cout << "gpt logits vs PyTorch (variant " << variant << "): max |diff| = " << max_diff
              << "\n";
  }
}

TEST(GptModel, ParameterCountIsTheFormula) {
  for (bool tie : {false, true}) {
    TransformerShape o = small_gpt(tie);
    EXPECT_EQ(count_parameters(*build_gpt(o, 0)), gpt_parameter_count(o));
    o.layers = 3;
    o.hidden = 48;
    o.heads = 6;
    o.vocab = 256;
    EXPECT_EQ(count_parameters(*build_gpt(o, 0)), gpt_parameter_count(o));
  }
  // 256*64 + 64*64 + 2*(12*64^2 + 13*64) + 2*64 + 256*64 = 136,960 for the defaults.
  EXPECT_EQ(gpt_parameter_count(TransformerShape{}), 136960);
}

TEST(GptModel, ChildrenAndModuleNames) {
  auto model = build_model("gpt", ModelOptions{0, 0, small_gpt(false)});
  std::vector<std::string> children;
  for (const auto& item : model->named_children())
    children.push_back(item.key());
  EXPECT_EQ(children, (std::vector<std::string>{"embed", "block0", "block1", "ln_f", "head"}));
  const auto modules = model->named_modules();
  for (const std::string name :
       {"block0.ln1", "block0.attn.q", "block0.attn.k", "block0.attn.v", "block0.attn.out",
        "block1.ln2", "block1.mlp.fc", "block1.mlp.proj"})
    EXPECT_TRUE(modules.contains(name)) << name;
  EXPECT_TRUE(modules["block1.mlp.proj"]->as<torch::nn::LinearImpl>() != nullptr);
  EXPECT_THROW(build_gpt(
                   [] {
                     TransformerShape o;
                     o.heads = 5;
                     return o;
                   }(),
                   0),
               std::invalid_argument);
  EXPECT_THROW(model->forward(torch::zeros({1, 17}, torch::kLong)), std::invalid_argument);
}

TEST(GptModel, TiedHeadIsListedOnceAndTrainedByBothUses) {
  // LibTorch 1.13's parameters() lists a tensor registered twice twice; unique_parameters once.
  torch::nn::Module m;
  torch::Tensor shared = m.register_parameter("a", torch::zeros({2}));
  m.register_parameter("b", shared);
  EXPECT_EQ(m.parameters().size(), 2u);
  EXPECT_EQ(unique_parameters(m).size(), 1u);

  auto tied = build_model("gpt", ModelOptions{1, 0, small_gpt(true)});
  const auto params = tied->parameters();
  EXPECT_EQ(params.size(), unique_parameters(*tied).size());
  EXPECT_EQ(params.size() + 1,
            build_model("gpt", ModelOptions{1, 0, small_gpt(false)})->parameters().size());
  // Token 5 is never an input, so its wte row gets a gradient only through the head.
  torch::Tensor tokens = torch::full({1, 4}, 9, torch::kLong);
  tied->forward(tokens).sum().backward();
  auto* embed = tied->named_children()["embed"]->as<GptEmbeddingImpl>();
  EXPECT_GT(embed->wte.grad()[5].abs().sum().item<double>(), 0.0);
}

TEST(GptRecompute, SameLossAndGradientsWithLessActivationMemory) {
  LossAndGrads off, selective, on;
  const int64_t peak_off = peak_activations(Recompute::None, off);
  const int64_t peak_selective = peak_activations(Recompute::Selective, selective);
  const int64_t peak_on = peak_activations(Recompute::Full, on);
  for (const LossAndGrads* r : {&selective, &on}) {
    const char* what = r == &on ? "full" : "selective";
    EXPECT_NEAR(r->loss, off.loss, 1e-6) << what;
    ASSERT_EQ(r->grads.size(), off.grads.size()) << what;
    for (size_t i = 0; i < r->grads.size(); ++i)
      EXPECT_LT((r->grads[i] - off.grads[i]).abs().max().item<double>(), 1e-6)
          << what << " param " << i;
  }
  EXPECT_LT(peak_selective, peak_off);
  EXPECT_LT(peak_on, peak_selective);
  const auto percent = [&](int64_t peak) { return 100.0 * double(peak) / double(peak_off); };
  std::cout << "gpt 4 blocks, B=8 T=64 H=64: peak activations " << peak_off
            << " B without recompute, " << peak_selective << " B selective ("
            << percent(peak_selective) << "%), " << peak_on << " B full (" << percent(peak_on)
            << "%)\n";
  RecordProperty("peak_activations_off", std::to_string(peak_off));
  RecordProperty("peak_activations_selective", std::to_string(peak_selective));
  RecordProperty("peak_activations_on", std::to_string(peak_on));
}

// Selective recompute runs the attention core's very kernels again on the same q, k and v,
// so in bf16 (and in any dtype) the loss and the gradients are bitwise those without it. The
// one exception is the key bias: its gradient is zero in exact arithmetic (it shifts each
// query's scores by the same amount, which softmax ignores), so what is computed is rounding
// noise, whose value depends on the order the batch is summed in.
TEST(GptRecompute, SelectiveIsBitwiseTheSameInBf16) {
  ensure_kernels_for(torch::kBFloat16);
  const Dataset data = synthetic_text(4, 0, 16, 64, 5).train;
  std::vector<LossAndGrads> runs;
  std::vector<std::string> names;
  for (Recompute r : {Recompute::None, Recompute::Selective}) {
    auto model = build_model("gpt", ModelOptions{1, 0, small_gpt(false), torch::kBFloat16});
    set_recompute(model, r);
    runs.push_back(loss_and_grads(model, data));
    names = model->named_parameters().keys();
  }
  EXPECT_EQ(runs[1].loss, runs[0].loss);
  ASSERT_EQ(runs[1].grads.size(), runs[0].grads.size());
  ASSERT_EQ(names.size(), runs[0].grads.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const torch::Tensor &got = runs[1].grads[i], &want = runs[0].grads[i];
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
    if (names[i].find("attn.k.bias") == std::string::npos) {
      EXPECT_TRUE(torch::equal(got, want)) << names[i];
      continue;
    }
    for (const torch::Tensor& noise : {got, want})
      EXPECT_LT(noise.abs().max().item<float>(), 1e-5) << names[i];
  }
}

TEST(GptRecompute, LossFallsOnSyntheticText) {
  // The synthetic sequences are learnable: a few Adam steps lower the loss clearly.
  const Dataset data = synthetic_text(32, 0, 16, 64, 2).train;
  auto model = build_model("gpt", ModelOptions{0, 0, small_gpt(false)});
  set_recompute(model, Recompute::Full);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    adam.zero_grad();
    torch::Tensor loss = loss_fn(model->forward(data.images), data.labels);
    loss.backward();
    adam.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.8 * first) << "first " << first << " last " << last;
}
