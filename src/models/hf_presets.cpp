// The presets read from published Hugging Face config.json files (src/models/hf_configs/, built
// into the binary by CMake): each is parsed by the parser --hf-config uses (hf_config.h), so a
// preset is exactly what its file says.
#include <cstddef>
#include <string>

#include "models/hf_config.h"
#include "models/presets.h"

namespace meshsim {
namespace assets {
// Generated from src/models/hf_configs/*.json (CMakeLists.txt, cmake/embed_assets.cmake).
extern const unsigned char kHfConfig_llama3_1_8b[];
extern const std::size_t kHfConfig_llama3_1_8b_size;
extern const unsigned char kHfConfig_llama3_1_70b[];
extern const std::size_t kHfConfig_llama3_1_70b_size;
extern const unsigned char kHfConfig_llama3_1_405b[];
extern const std::size_t kHfConfig_llama3_1_405b_size;
extern const unsigned char kHfConfig_mixtral_8x7b[];
extern const std::size_t kHfConfig_mixtral_8x7b_size;
extern const unsigned char kHfConfig_mixtral_8x22b[];
extern const std::size_t kHfConfig_mixtral_8x22b_size;
extern const unsigned char kHfConfig_qwen3_30b_a3b[];
extern const std::size_t kHfConfig_qwen3_30b_a3b_size;
extern const unsigned char kHfConfig_qwen3_235b_a22b[];
extern const std::size_t kHfConfig_qwen3_235b_a22b_size;
extern const unsigned char kHfConfig_deepseek_v3[];
extern const std::size_t kHfConfig_deepseek_v3_size;
} // namespace assets

namespace {

struct HfPresetFile {
  const char* name;
  const unsigned char* text;
  const std::size_t& size;
  const char* source;
};

ModelPreset parsed(const HfPresetFile& f) {
  const std::string file = std::string("src/models/hf_configs/") + f.name + ".json";
  const std::string text(reinterpret_cast<const char*>(f.text), f.size);
  HfModel model = parse_hf_config(nlohmann::json::parse(text), file);
  ModelPreset p{f.name, model.family, model.shape, std::string(f.source) + " (" + file + ")", file};
  return p;
}

} // namespace

std::vector<ModelPreset> hf_presets() {
  using namespace assets;
  const HfPresetFile files[] = {
      {"llama3.1-8b", kHfConfig_llama3_1_8b, kHfConfig_llama3_1_8b_size,
       "meta-llama/Llama-3.1-8B config.json"},
      {"llama3.1-70b", kHfConfig_llama3_1_70b, kHfConfig_llama3_1_70b_size,
       "meta-llama/Llama-3.1-70B config.json"},
      {"llama3.1-405b", kHfConfig_llama3_1_405b, kHfConfig_llama3_1_405b_size,
       "meta-llama/Llama-3.1-405B config.json"},
      {"mixtral-8x7b", kHfConfig_mixtral_8x7b, kHfConfig_mixtral_8x7b_size,
       "mistralai/Mixtral-8x7B-v0.1 config.json"},
      {"mixtral-8x22b", kHfConfig_mixtral_8x22b, kHfConfig_mixtral_8x22b_size,
       "mistralai/Mixtral-8x22B-v0.1 config.json"},
      {"qwen3-30b-a3b", kHfConfig_qwen3_30b_a3b, kHfConfig_qwen3_30b_a3b_size,
       "Qwen/Qwen3-30B-A3B config.json"},
      {"qwen3-235b-a22b", kHfConfig_qwen3_235b_a22b, kHfConfig_qwen3_235b_a22b_size,
       "Qwen/Qwen3-235B-A22B config.json"},
      {"deepseek-v3", kHfConfig_deepseek_v3, kHfConfig_deepseek_v3_size,
       "deepseek-ai/DeepSeek-V3 config.json; its multi-token prediction module is not built"},
  };
  std::vector<ModelPreset> out;
  for (const HfPresetFile& f : files)
    out.push_back(parsed(f));
  return out;
}

} // namespace meshsim
