// The slots a transformer block is assembled from (models/layers/): an attention core that
// reads explicit positions, rotary embeddings at explicit positions, a core plugged into an
// attention, the feed-forward slot; and each model's parallel plan against the model it
// describes.
#include <gtest/gtest.h>

#include <set>

#include "models/gpt.h"
#include "models/layers/eager_core.h"
#include "models/layers/rotary.h"
#include "models/llama.h"
#include "parallel/pipeline/pipeline.h"

using namespace meshsim;

// The file's own namespace, its tests inside it (README, Development: the unity build).
namespace layers_test {

// Gathers dimension 2 (the tokens of [B, heads, T, d]) in the order `perm`.
torch::Tensor tokens_at(const torch::Tensor& x, const torch::Tensor& perm) {
  return x.index_select(2, perm);
}

// Records the positions it was given, then runs the eager core.
class RecordingCore : public AttentionCore {
public:
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& positions) const override {
    seen.push_back(positions);
    return causal_attention(q, k, v, positions);
  }
  mutable std::vector<torch::Tensor> seen;
};

TransformerShape small(int64_t layers) {
  TransformerShape o;
  o.layers = layers;
  o.hidden = 32;
  o.heads = 4;
  o.seq_len = 16;
  o.vocab = 64;
  return o;
}

TEST(AttentionCore, TheMaskFollowsPositionsNotTheOrderOfTokens) {
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor q = torch::randn({2, 3, 8, 4}, f64), k = torch::randn({2, 3, 8, 4}, f64),
                      v = torch::randn({2, 3, 8, 4}, f64);
  const torch::Tensor in_order = torch::arange(8, torch::kLong);
  const torch::Tensor perm = torch::randperm(8, torch::kLong);
  const torch::Tensor whole = causal_attention(q, k, v, in_order);
  // Tokens held out of order (as a context-parallel rank holds its chunks), each with its
  // own position: the same outputs, in that order.
  const torch::Tensor shuffled =
      causal_attention(tokens_at(q, perm), tokens_at(k, perm), tokens_at(v, perm), perm);
  EXPECT_TRUE(torch::allclose(shuffled, tokens_at(whole, perm), 1e-12, 1e-12));
}

TEST(Rotary, RotatesEachTokenByItsOwnPosition) {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({1, 2, 8, 6}, torch::kFloat64);
  const torch::Tensor perm = torch::randperm(8, torch::kLong);
  const torch::Tensor whole = apply_rotary(x, torch::arange(8, torch::kLong), 10000);
  EXPECT_TRUE(torch::allclose(apply_rotary(tokens_at(x, perm), perm, 10000), tokens_at(whole, perm),
                              1e-12, 1e-12));
  // Position 0 is not rotated.
  EXPECT_TRUE(torch::equal(whole.narrow(2, 0, 1), x.narrow(2, 0, 1)));
}

TEST(Attention, RunsThePluggedCoreAtTheWholeSequencesPositions) {
  torch::manual_seed(5);
  auto core = std::make_shared<RecordingCore>();
  Attention plugged(AttentionOptions{32, 4, 2, false, "o", 10000}, torch::TensorOptions(), core);
  Attention eager(AttentionOptions{32, 4, 2, false, "o", 10000});
  {
    torch::NoGradGuard no_grad;
    const auto a = plugged->parameters(), b = eager->parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      b[i].copy_(a[i].normal_(0, 0.02));
  }
  const torch::Tensor x = torch::randn({2, 8, 32});
  const torch::Tensor y = plugged->forward(x);
  ASSERT_EQ(core->seen.size(), 1u);
  EXPECT_TRUE(torch::equal(core->seen[0], torch::arange(8, torch::kLong)));
  EXPECT_TRUE(torch::equal(y, eager->forward(x)));
  // Explicit positions 0..T-1 are what it passes when given none.
  EXPECT_TRUE(torch::equal(plugged->forward(x, torch::arange(8, torch::kLong)), y));
  // Parameter names: the projections only (the core is no child).
  std::vector<std::string> names;
  for (const auto& p : plugged->named_parameters())
    names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"q.weight", "k.weight", "v.weight", "o.weight"}));
}

TEST(GptEmbedding, ExplicitPositionsPickTheirRowsOfWpe) {
  torch::manual_seed(6);
  GptEmbedding embed(64, 8, 16);
  {
    torch::NoGradGuard no_grad;
    embed->wte.normal_();
    embed->wpe.normal_();
  }
  const torch::Tensor tokens = torch::randint(64, {2, 5}, torch::kLong);
  const torch::Tensor plain = embed->forward(tokens);
  EXPECT_TRUE(torch::equal(embed->forward(tokens, torch::arange(5, torch::kLong)), plain));
  const torch::Tensor later = torch::arange(7, 12, torch::kLong);
  const torch::Tensor y = embed->forward(tokens, later);
  EXPECT_TRUE(torch::allclose(y - torch::nn::functional::embedding(tokens, embed->wte),
                              embed->wpe.narrow(0, 7, 5).expand({2, 5, 8}), 1e-6, 1e-6));
  EXPECT_THROW(embed->forward(tokens, torch::arange(4, torch::kLong)), std::invalid_argument);
}

TEST(FeedForward, EachLayerGetsItsOwnFromTheModel) {
  const TransformerShape o = small(2);
  const auto gpt = gpt_feed_forward(o, 1);
  EXPECT_NE(dynamic_cast<GptMlpImpl*>(gpt.get()), nullptr);
  const auto llama = llama_feed_forward(o, 0);
  EXPECT_NE(dynamic_cast<SwiGluMlpImpl*>(llama.get()), nullptr);
  const torch::Tensor x = torch::randn({2, 3, 32});
  EXPECT_EQ(gpt->forward(x).sizes(), x.sizes());
  EXPECT_EQ(llama->forward(x).sizes(), x.sizes());
}

TEST(ParallelPlan, EachModelsPlanNamesItsOwnModules) {
  for (const std::string name : {"gpt", "llama"}) {
    TransformerShape o = small(3);
    o.kv_heads = name == "llama" ? 2 : 0;
    ModelOptions options;
    options.shape = o;
    const auto model = build_model(name, options);
    const ParallelPlan plan = parallel_plan(name, o);
    const auto modules = model->named_modules();
    EXPECT_EQ(plan.linears.size(), static_cast<size_t>(o.layers) * (name == "gpt" ? 6 : 7));
    for (const auto& [linear, style] : plan.linears) {
      ASSERT_TRUE(modules.contains(linear)) << linear;
      EXPECT_NE(modules[linear]->as<torch::nn::Linear>(), nullptr) << linear;
    }
    ASSERT_EQ(plan.attention.size(), static_cast<size_t>(o.layers));
    for (const auto& attention : plan.attention)
      EXPECT_NE(dynamic_cast<const AttentionHeads*>(modules[attention].get()), nullptr);
    std::set<std::string> children;
    for (const auto& child : model->named_children())
      children.insert(child.key());
    EXPECT_TRUE(children.count(plan.vocab_head));
    EXPECT_TRUE(children.count(plan.sequence_after));
    EXPECT_TRUE(children.count(plan.sequence_before));
    EXPECT_EQ(pipeline_units(model, plan), 3);
    // The units start at the blocks: embed joins the first, norm and head the last.
    EXPECT_EQ(stage_children(model, plan, 3, 0), (std::vector<size_t>{0, 1}));
    EXPECT_EQ(stage_children(model, plan, 3, 1), (std::vector<size_t>{2}));
    EXPECT_EQ(stage_children(model, plan, 3, 2), (std::vector<size_t>{3, 4, 5}));
  }
  ParallelPlan wrong = gpt_parallel_plan(small(3));
  wrong.pipeline_units.push_back("block9");
  ModelOptions options;
  options.shape = small(3);
  EXPECT_THROW(stage_children(build_model("gpt", options), wrong, 2, 0), std::invalid_argument);
  EXPECT_THROW(parallel_plan("resnet50", small(1)), std::invalid_argument);
}

} // namespace layers_test
