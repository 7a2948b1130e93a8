// The Llama against PyTorch itself (same seed and init; float64 logits, loss and every
// gradient), its parameter count against the closed formula and against published counts,
// Meta's MLP-width rule, grouped-query attention, activation checkpointing, and training.
#include <gtest/gtest.h>

#include <cstdio>
#include <iostream>

#include "data/text.h"
#include "models/llama.h"
#include "parallel/strategy.h"
#include "../python_torch.h"
#include "llama_reference.h"

using namespace meshsim;
using meshsim::testing::python_torch_available;
using meshsim::testing::expect_llama_matches_pytorch;

namespace {

TransformerShape small_llama(int64_t kv_heads) {
  TransformerShape o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.kv_heads = kv_heads;
  o.seq_len = 16;
  o.vocab = 64;
  return o;
}


} // namespace


// Against PyTorch within kFloat64ModelTolerance (llama_reference.h derives it).
TEST(LlamaModel, LogitsLossAndGradientsMatchPyTorch) {
  if (!python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  for (int64_t kv : {int64_t{0}, int64_t{2}, int64_t{1}}) { // multi-head, grouped, multi-query
    TransformerShape o = small_llama(kv);
    o.rope_theta = kv == 1 ? 500000 : 10000;
    const auto r = expect_llama_matches_pytorch(o, "kv " + std::to_string(kv));
    std::cout << "llama (kv heads " << llama_kv_heads(o) << ") vs PyTorch, float64: loss "
              << r.loss << ", logits rel. error " << r.logit_error
              << ", worst gradient rel. error " << r.grad_error << "\n";
  }
}

TEST(LlamaModel, ParameterCountIsTheFormula) {
  for (int64_t kv : {0, 1, 2, 4}) {
    TransformerShape o = small_llama(kv);
    EXPECT_EQ(count_parameters(*build_llama(o, 0)), llama_parameter_count(o)) << "kv " << kv;
    o.layers = 3;
    o.hidden = 48;
    o.heads = 6;
    o.kv_heads = kv == 4 ? 3 : kv;
    o.ffn_hidden = 100;
    EXPECT_EQ(count_parameters(*build_llama(o, 0)), llama_parameter_count(o)) << "kv " << kv;
  }
}

TEST(LlamaModel, PublishedParameterCountsOnMeta) {
  // Shapes and counts from the models' cards (Llama 2 7B: Hugging Face meta-llama/
  // Llama-2-7b-hf config.json and its safetensors total; Llama 3 8B: meta-llama/
  // Meta-Llama-3-8B). Built on meta, so nothing is allocated.
  TransformerShape llama2_7b;
  llama2_7b.layers = 32;
  llama2_7b.hidden = 4096;
  llama2_7b.heads = 32;
  llama2_7b.seq_len = 4096;
  llama2_7b.vocab = 32000; // ffn 0: Meta's rule gives 11008, the published width
  TransformerShape llama3_8b = llama2_7b;
  llama3_8b.kv_heads = 8;
  llama3_8b.ffn_hidden = 14336;
  llama3_8b.vocab = 128256;
  llama3_8b.seq_len = 8192;
  llama3_8b.rope_theta = 500000;
  const std::vector<std::pair<TransformerShape, int64_t>> cases{{llama2_7b, 6'738'415'616},
                                                          {llama3_8b, 8'030'261'248}};
  for (const auto& [o, published] : cases) {
    ModelOptions mo;
    mo.shape = o;
    mo.device = torch::kMeta;
    mo.dtype = torch::kBFloat16;
    auto model = build_model("llama", mo);
    EXPECT_EQ(count_parameters(*model), published);
    EXPECT_EQ(llama_parameter_count(o), published);
    for (const auto& p : model->parameters())
      EXPECT_TRUE(p.is_meta() && p.dtype() == torch::kBFloat16);
  }
}

TEST(LlamaModel, MetasMlpWidthRule) {
  // 256·ceil(int(8H/3) / 256): Llama 1/2 7B (H 4096) 11008, 13B (H 5120) 13824, 65B (H 8192)
  // 22016, as published; the tiny default (H 64) 256.
  const std::vector<std::pair<int64_t, int64_t>> cases{
      {4096, 11008}, {5120, 13824}, {8192, 22016}, {64, 256}};
  for (const auto& [hidden, ffn] : cases) {
    TransformerShape o;
    o.hidden = hidden;
    EXPECT_EQ(llama_ffn_hidden(o), ffn) << "hidden " << hidden;
  }
  TransformerShape o;
  o.ffn_hidden = 100;
  EXPECT_EQ(llama_ffn_hidden(o), 100);
}

TEST(LlamaModel, ChildrenSlotsAndBadOptions) {
  auto model = build_model("llama", ModelOptions{0, 0, small_llama(2)});
  std::vector<std::string> children;
  for (const auto& item : model->named_children())
    children.push_back(item.key());
  EXPECT_EQ(children, (std::vector<std::string>{"embed", "block0", "block1", "norm_f", "head"}));
  const auto modules = model->named_modules();
  for (const std::string name : {"block0.attn.q", "block0.attn.k", "block0.attn.v", "block0.attn.o",
                                 "block1.mlp.gate", "block1.mlp.up", "block1.mlp.down", "head"})
    EXPECT_TRUE(modules[name]->as<torch::nn::LinearImpl>() != nullptr) << name;
  // Grouped-query attention: k and v have kv_heads · head_dim outputs.
  const auto params = model->named_parameters();
  EXPECT_EQ(params["block0.attn.k.weight"].sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(params["block0.attn.q.weight"].sizes(), (std::vector<int64_t>{32, 32}));
  for (const auto& p : model->named_parameters())
    EXPECT_EQ(p.key().find("bias"), std::string::npos) << p.key();
  EXPECT_THROW(model->forward(torch::zeros({1, 17}, torch::kLong)), std::invalid_argument);

  const auto bad = [](auto change) {
    TransformerShape o = small_llama(2);
    change(o);
    return o;
  };
  EXPECT_THROW(build_llama(bad([](TransformerShape& o) { o.kv_heads = 3; }), 0), std::invalid_argument);
  EXPECT_THROW(build_llama(bad([](TransformerShape& o) { o.heads = 5; }), 0), std::invalid_argument);
  EXPECT_THROW(build_llama(bad([](TransformerShape& o) { o.heads = 32; }), 0), // head_dim 1: odd
               std::invalid_argument);
  EXPECT_NO_THROW(build_llama(bad([](TransformerShape& o) { o.tie_head = true; }), 0));
  EXPECT_THROW(build_llama(bad([](TransformerShape& o) { o.rope_theta = 0; }), 0), std::invalid_argument);
}

TEST(LlamaModel, RecomputeGivesTheSameLossAndGradients) {
  const Dataset data = synthetic_text(4, 0, 16, 64, 5).train;
  const std::vector<Recompute> modes{Recompute::None, Recompute::Selective, Recompute::Op,
                                     Recompute::Full};
  std::vector<std::vector<torch::Tensor>> grads(modes.size());
  std::vector<double> losses(modes.size());
  for (size_t on = 0; on < modes.size(); ++on) {
    auto model = build_model("llama", ModelOptions{1, 0, small_llama(2), torch::kFloat64});
    set_recompute(model, modes[on]);
    torch::Tensor loss = loss_fn(model->forward(data.images), data.labels);
    loss.backward();
    losses[on] = loss.item<double>();
    for (const auto& p : unique_parameters(*model))
      grads[on].push_back(p.grad().clone());
  }
  // The recompute runs the very same float64 operations again: identical results.
  for (size_t on = 1; on < modes.size(); ++on) {
    EXPECT_EQ(losses[0], losses[on]) << "mode " << on;
    ASSERT_EQ(grads[0].size(), grads[on].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(torch::equal(grads[0][i], grads[on][i])) << "mode " << on << " parameter " << i;
  }
}

TEST(LlamaModel, LossFallsOnSyntheticText) {
  const Dataset data = synthetic_text(32, 0, 16, 64, 2).train;
  auto model = build_model("llama", ModelOptions{0, 0, small_llama(2)});
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
