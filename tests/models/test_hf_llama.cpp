// The Llama's variants that Hugging Face configs describe (models/hf_config.h): an explicit
// head width, q/k/v and output biases (Qwen2, attention_bias), Qwen3's per-head q/k RMSNorm,
// another norm epsilon, Llama 3.1's rotary scaling, a tied head, and Qwen3-MoE's router without
// renormalisation (norm_topk_prob false). Each against PyTorch (reference_llama.py, float64:
// logits, loss and every gradient within kFloat64ModelTolerance), and each model's closed-form
// parameter count against the built model's, on the CPU and on meta.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "../python_torch.h"
#include "llama_reference.h"
#include "models/llama.h"
#include "models/models.h"

using namespace meshsim;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace hf_llama_test {

TransformerShape tiny() {
  TransformerShape s;
  s.layers = 2;
  s.hidden = 16;
  s.heads = 4;
  s.kv_heads = 2;
  s.ffn_hidden = 24;
  s.seq_len = 16;
  s.vocab = 64;
  return s;
}

// Heads 8 wide at theta 10000: wavelengths 6.3, 63, 628 and 6283 positions. An original context
// of 100 (factor 8, low 1, high 4) keeps the first (below 25), blends the second (25 to 100) and
// stretches the last two: every branch of the rule.
TransformerShape llama3_scaled() {
  TransformerShape s = tiny();
  s.head_dim = 8;
  s.rope_scaling = RopeScaling{8, 1, 4, 100};
  return s;
}

// One shape per variant, and one with all of them and a mixture of experts.
std::vector<std::pair<std::string, TransformerShape>> variants() {
  std::vector<std::pair<std::string, TransformerShape>> out;
  TransformerShape s = tiny();
  s.head_dim = 6; // 4 heads of 6 in a hidden of 16: q is 24 wide
  out.emplace_back("head_dim 6", s);
  s = tiny();
  s.qkv_bias = true;
  out.emplace_back("q/k/v biases (qwen2)", s);
  s.out_bias = true;
  out.emplace_back("q/k/v/o biases (attention_bias)", s);
  s = tiny();
  s.qk_norm = true;
  s.norm_eps = 1e-6;
  out.emplace_back("q/k norms, eps 1e-6 (qwen3)", s);
  out.emplace_back("llama3 rope scaling", llama3_scaled());
  s = tiny();
  s.tie_head = true;
  out.emplace_back("tied head (tie_word_embeddings)", s);
  s = tiny();
  s.head_dim = 8;
  s.qk_norm = true;
  s.qkv_bias = s.out_bias = true;
  s.norm_eps = 1e-6;
  s.moe.experts = 4;
  s.moe.top_k = 2;
  s.moe.ffn = 8;
  s.moe.normalize = false;
  s.moe.dense_layers = 1;
  s.moe.aux_loss = 0.001;
  out.emplace_back("qwen3_moe: all of them, top-2 of 4 not renormalised", s);
  return out;
}

TEST(HfLlamaVariants, ParameterCountIsTheBuiltModels) {
  for (const auto& [what, s] : variants()) {
    ModelOptions options;
    options.shape = s;
    EXPECT_EQ(count_parameters(*build_model("llama", options)), llama_parameter_count(s)) << what;
    options.device = torch::kMeta;
    EXPECT_EQ(count_parameters(*build_model("llama", options)), llama_parameter_count(s)) << what;
  }
}

TEST(HfLlamaVariants, LogitsLossAndGradientsMatchPyTorch) {
  if (!meshsim::testing::python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  for (const auto& [what, s] : variants()) {
    const auto r = meshsim::testing::expect_llama_matches_pytorch(s, what);
    std::cout << what << " vs PyTorch, float64: loss " << r.loss << ", logits rel. error "
              << r.logit_error << ", worst gradient rel. error " << r.grad_error << "\n";
  }
}

// The rotary scaling changes the model: the same weights with and without it give other
// logits past the original context (what the comparison above would not see if the scaling
// were dropped on both sides).
TEST(HfLlamaVariants, Llama3ScalingChangesTheLogits) {
  const TransformerShape scaled = llama3_scaled();
  TransformerShape plain = scaled;
  plain.rope_scaling = RopeScaling{};
  ModelOptions a{3, 0, plain, torch::kFloat64}, b{3, 0, scaled, torch::kFloat64};
  const torch::Tensor tokens = meshsim::testing::fixed_tokens(1, 12, plain.vocab, 7, 13, 3);
  const double difference =
      (build_model("llama", a)->forward(tokens) - build_model("llama", b)->forward(tokens))
          .abs()
          .max()
          .item<double>();
  EXPECT_GT(difference, 1e-6);
}

} // namespace hf_llama_test
