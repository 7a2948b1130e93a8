// FP8 training's extra memory in a plan: see fp8_state.h.
#include "parallel/fp8_state.h"

#include "memory/allocator.h"

namespace meshsim {

Fp8Footprint fp8_footprint(const torch::nn::Sequential& stage,
                           const std::vector<ParamGroup>& groups, int zero) {
  const auto named = stage->named_parameters();
  std::vector<int64_t> shards(named.size(), 1);
  if (zero >= 3)
    for (const ParamGroup& g : groups)
      for (size_t i : g.params)
        shards[i] = std::max(1, g.group.size());
  Fp8Footprint f;
  for (size_t i = 0; i < named.size(); ++i) {
    const torch::Tensor& p = named[i].value();
    if (named[i].key().rfind("block", 0) != 0 || p.dim() < 2)
      continue;
    f.weight_elements += (p.numel() + shards[i] - 1) / shards[i];
    f.gemms += p.dim() == 3 ? p.size(0) : 1;
  }
  return f;
}

std::vector<torch::Tensor> allocate_fp8_state(const Fp8Footprint& footprint,
                                              torch::Device device) {
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  std::vector<torch::Tensor> state;
  {
    CategoryScope scope(MemoryCategory::Parameters); // the weights' FP8 copy and its transpose
    state.push_back(torch::empty({2 * footprint.weight_elements}, bytes));
  }
  CategoryScope scope(MemoryCategory::Other);
  state.push_back(torch::empty({footprint.gemms * kFp8ScalingBytesPerGemm}, bytes));
  return state;
}

} // namespace meshsim
