// Slots: the children of a layer that a strategy may swap for another module of the same
// forward signature (Tensor -> Tensor), e.g. tensor parallelism's column- and row-parallel
// shards in place of a Linear.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace meshsim {

/// A module whose Linear children may be replaced by name with any module of the same
/// forward signature (Tensor -> Tensor). LibTorch's replace_module() only updates the child
/// registry; the module's own holder must be updated too, which is what this does.
class LinearSlots {
public:
  virtual ~LinearSlots() = default;
  /// Replaces child `name` (registry and the holder used by forward). Throws
  /// std::invalid_argument for a name that is not a slot.
  virtual void replace_linear(const std::string& name, torch::nn::AnyModule module) = 0;
  /// A shard of slot `name` must hold a multiple of this many output (column) or input (row)
  /// features: attention splits by whole heads.
  virtual int64_t shard_granularity(const std::string& name) const { return 1; }
  /// What slot `name` reads: column-parallel slots of one module that read the same tensor
  /// ("" for the module's input) share one copy of it into the tensor-parallel region.
  virtual std::string slot_input(const std::string& name) const { return ""; }
};

/// The [out, in] weight of a Linear slot as this rank holds it (a Linear, or a column- or
/// row-parallel shard of one), or an undefined tensor for a module without a 2-D weight.
inline torch::Tensor slot_weight(const torch::nn::Module& linear) {
  for (const auto& p : linear.named_parameters(/*recurse=*/false))
    if (p.key() == "weight" && p.value().dim() == 2)
      return p.value();
  return {};
}

} // namespace meshsim
