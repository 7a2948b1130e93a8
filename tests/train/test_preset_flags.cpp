// apply_preset and validate_shape (config/config.h): a preset sets the shape, each flag given
// overrides its own field, and every inconsistent combination is a one-line refusal.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "models/presets.h"
#include "config/config.h"
#include "error_of.h"

namespace meshsim {
namespace {

using testing::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PresetFlags, PresetSetsTheShapeAndGivenFlagsWin) {
  const TransformerShape& gpt2 = find_preset("gpt2")->shape;
  TrainConfig c;
  c.preset = "gpt2";
  c.shape.layers = 3; // as if --layers 3 and --vocab 256 were given
  c.shape.vocab = 256;
  c.shape.hidden = 5; // the default's value, not given: the preset's wins
  ModelFlagsGiven given;
  given.preset = true;
  given.shape = {"--layers", "--vocab"};
  apply_preset(c, given);
  EXPECT_EQ(c.model, "gpt");
  EXPECT_EQ(c.preset, "gpt2");
  EXPECT_EQ(c.shape.layers, 3);
  EXPECT_EQ(c.shape.vocab, 256);
  EXPECT_EQ(c.shape.hidden, gpt2.hidden);
  EXPECT_EQ(c.shape.heads, gpt2.heads);
  EXPECT_EQ(c.shape.seq_len, gpt2.seq_len);
  EXPECT_TRUE(c.shape.tie_head);
}

TEST(PresetFlags, EveryShapeFlagOverridesItsField) {
  const ModelPreset& p = *find_preset("llama3-8b");
  TrainConfig c;
  c.preset = p.name;
  c.shape = {1, 2, 3, 4, 5, false};
  c.shape.kv_heads = 6;
  c.shape.ffn_hidden = 7;
  c.shape.rope_theta = 8;
  c.shape.moe.experts = 9;
  c.shape.moe.top_k = 10;
  c.shape.moe.ffn = 11;
  c.shape.moe.shared_ffn = 12;
  c.shape.moe.dense_layers = 13;
  c.shape.moe.router = "sigmoid";
  c.shape.moe.groups = 14;
  c.shape.moe.aux_loss = 15;
  c.shape.moe.capacity_factor = 16;
  ModelFlagsGiven given;
  given.preset = true;
  given.shape = shape_flag_names();
  apply_preset(c, given);
  EXPECT_EQ(c.model, "llama");
  EXPECT_EQ(c.shape.layers, 1);
  EXPECT_EQ(c.shape.hidden, 2);
  EXPECT_EQ(c.shape.heads, 3);
  EXPECT_EQ(c.shape.seq_len, 4);
  EXPECT_EQ(c.shape.vocab, 5);
  EXPECT_EQ(c.shape.kv_heads, 6);
  EXPECT_EQ(c.shape.ffn_hidden, 7);
  EXPECT_EQ(c.shape.rope_theta, 8);
  EXPECT_FALSE(c.shape.tie_head);
  EXPECT_EQ(c.shape.moe.experts, 9);
  EXPECT_EQ(c.shape.moe.top_k, 10);
  EXPECT_EQ(c.shape.moe.ffn, 11);
  EXPECT_EQ(c.shape.moe.shared_ffn, 12);
  EXPECT_EQ(c.shape.moe.dense_layers, 13);
  EXPECT_EQ(c.shape.moe.router, "sigmoid");
  EXPECT_EQ(c.shape.moe.groups, 14); // the router's flag carries its grouping
  EXPECT_EQ(c.shape.moe.aux_loss, 15);
  EXPECT_EQ(c.shape.moe.capacity_factor, 16);
  EXPECT_EQ(shape_flag_names().size(), 17u);

  // None given: every field is the preset's.
  TrainConfig d;
  d.preset = p.name;
  ModelFlagsGiven only_preset;
  only_preset.preset = true;
  apply_preset(d, only_preset);
  EXPECT_EQ(d.shape.layers, 32);
  EXPECT_EQ(d.shape.hidden, 4096);
  EXPECT_EQ(d.shape.heads, 32);
  EXPECT_EQ(d.shape.kv_heads, 8);
  EXPECT_EQ(d.shape.ffn_hidden, 14336);
  EXPECT_EQ(d.shape.vocab, 128256);
  EXPECT_EQ(d.shape.seq_len, 8192);
  EXPECT_EQ(d.shape.rope_theta, 500000);
  EXPECT_EQ(d.shape.moe.experts, 0); // a dense preset
}

TEST(PresetFlags, APresetNamedAsTheModelResolvesToItsFamily) {
  TrainConfig c;
  c.model = "gpt-175b";
  ModelFlagsGiven given;
  given.model = true;
  apply_preset(c, given);
  EXPECT_EQ(c.model, "gpt");
  EXPECT_EQ(c.preset, "gpt-175b");
  EXPECT_EQ(c.shape.layers, 96);
  EXPECT_EQ(c.shape.hidden, 12288);
  EXPECT_EQ(c.shape.heads, 96);
  EXPECT_EQ(c.shape.vocab, 51200);
  EXPECT_EQ(c.shape.seq_len, 2048);

  // The same preset by both flags, or --model of its family with --preset, is fine.
  TrainConfig both;
  both.model = both.preset = "llama3-70b";
  given.preset = true;
  apply_preset(both, given);
  EXPECT_EQ(both.model, "llama");
  TrainConfig family;
  family.model = "llama";
  family.preset = "llama3-70b";
  apply_preset(family, given);
  EXPECT_EQ(family.shape.hidden, 8192);
}

// A preset read from --config is the file's label: its shape is the file's, not re-applied.
TEST(PresetFlags, NothingHappensWithoutAPresetOnTheCommandLine) {
  TrainConfig c;
  c.model = "gpt";
  c.preset = "gpt2";
  c.shape.layers = 1;
  apply_preset(c, ModelFlagsGiven{});
  EXPECT_EQ(c.shape.layers, 1);
  ModelFlagsGiven family_only;
  family_only.model = true;
  apply_preset(c, family_only);
  EXPECT_EQ(c.shape.layers, 1);
  EXPECT_EQ(c.preset, "gpt2");
  // --model of another family drops the file's label (its shape no longer applies).
  c.model = "cnn";
  apply_preset(c, family_only);
  EXPECT_EQ(c.preset, "");
  EXPECT_NO_THROW(validate(c));
}

TEST(PresetFlags, InconsistentFlagsAreRefused) {
  ModelFlagsGiven preset_only;
  preset_only.preset = true;
  TrainConfig typo;
  typo.preset = "gpt-175";
  const std::string unknown = error_of([&] { apply_preset(typo, preset_only); });
  EXPECT_TRUE(contains(unknown, "unknown preset 'gpt-175'")) << unknown;
  EXPECT_TRUE(contains(unknown, "nearest: gpt-175b")) << unknown;
  EXPECT_TRUE(contains(unknown, "meshsim models")) << unknown;

  ModelFlagsGiven both;
  both.model = both.preset = true;
  TrainConfig two;
  two.model = "gpt2";
  two.preset = "gpt-1t";
  EXPECT_EQ(error_of([&] { apply_preset(two, both); }),
            "--model gpt2 and --preset gpt-1t name two different presets; give one");
  TrainConfig other;
  other.model = "gpt";
  other.preset = "llama3-8b";
  EXPECT_EQ(error_of([&] { apply_preset(other, both); }),
            "--preset llama3-8b is a llama model, not --model gpt");
  TrainConfig cnn;
  cnn.model = "cnn";
  cnn.preset = "gpt2";
  EXPECT_EQ(error_of([&] { apply_preset(cnn, both); }),
            "--preset gpt2 is a gpt model, not --model cnn");
}

// validate() checks a preset read from a file the same way.
TEST(PresetFlags, ValidateRefusesAnUnknownOrMismatchedPresetLabel) {
  TrainConfig unknown;
  unknown.model = "gpt";
  unknown.preset = "gpt-3";
  unknown.data = "synthetic";
  EXPECT_TRUE(contains(error_of([&] { validate(unknown); }), "unknown preset 'gpt-3'"));
  TrainConfig mismatch;
  mismatch.model = "cnn";
  mismatch.preset = "gpt2";
  EXPECT_EQ(error_of([&] { validate(mismatch); }), "preset gpt2 is a gpt model, not cnn");
  TrainConfig model_typo;
  model_typo.model = "llama3-8";
  const std::string message = error_of([&] { validate(model_typo); });
  EXPECT_TRUE(contains(message, "unknown model 'llama3-8'")) << message;
  EXPECT_TRUE(contains(message, "nearest llama3-8b")) << message;
}

TEST(PresetFlags, ValidateShapeRefusesEachBadValueInOneLine) {
  TransformerShape ok;
  EXPECT_NO_THROW(validate_shape("gpt", ok));
  EXPECT_NO_THROW(validate_shape("llama", ok));
  const struct {
    const char* family;
    void (*change)(TransformerShape&);
    const char* says;
  } cases[] = {
      {"gpt", [](TransformerShape& g) { g.layers = 0; }, "--layers must be positive, got 0"},
      {"gpt", [](TransformerShape& g) { g.hidden = -4; }, "--hidden must be positive, got -4"},
      {"llama", [](TransformerShape& g) { g.vocab = 0; }, "--vocab must be positive, got 0"},
      {"llama", [](TransformerShape& g) { g.seq_len = 0; }, "--seq-len must be positive, got 0"},
      {"llama", [](TransformerShape& g) { g.kv_heads = -1; }, "--kv-heads must be positive, got -1"},
      {"llama", [](TransformerShape& g) { g.ffn_hidden = -1; }, "--ffn-hidden must be positive, got -1"},
      {"gpt", [](TransformerShape& g) { g.heads = 5; }, "--hidden 64 is not divisible by --heads 5"},
      {"llama", [](TransformerShape& g) { g.kv_heads = 3; },
       "--heads 4 is not divisible by --kv-heads 3"},
      {"gpt", [](TransformerShape& g) { g.kv_heads = 2; }, "grouped-query attention is llama's"},
      {"llama", [](TransformerShape& g) { g.rope_theta = 0; }, "--rope-theta must be a positive finite"},
      {"llama", [](TransformerShape& g) { g.rope_theta = std::numeric_limits<double>::infinity(); },
       "--rope-theta must be a positive"},
      // 10^6 layers of width 10^5: about 1.2e16 parameters, whose int64 byte counts would be
      // 16 times that; refused before any count is formed.
      {"gpt", [](TransformerShape& g) { g.layers = 1000000, g.hidden = 100000, g.heads = 1; },
       "the model is too large"},
      {"gpt", [](TransformerShape& g) { g.hidden = int64_t{1} << 40, g.heads = 1; }, "too large"},
  };
  for (const auto& c : cases) {
    TransformerShape g;
    c.change(g);
    const std::string message = error_of([&] { validate_shape(c.family, g); });
    EXPECT_TRUE(contains(message, c.says)) << c.says << " | " << message;
  }
  // kv heads equal to heads is plain multi-head attention: fine for gpt.
  TransformerShape mha;
  mha.kv_heads = mha.heads;
  EXPECT_NO_THROW(validate_shape("gpt", mha));
  // Every preset is within the limit, with room to spare.
  for (const ModelPreset& p : model_presets())
    EXPECT_LT(preset_parameter_count(p.family, p.shape) * 100.0, kMaxParameters) << p.name;
}

} // namespace
} // namespace meshsim
