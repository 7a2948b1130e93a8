// Slots: the children of a layer that a strategy may swap for another module of the same
// forward signature (Tensor -> Tensor), e.g. tensor parallelism's column- and row-parallel
// shards in place of a Linear.
#pragma once

#include <cstdint>
#include <functional>
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

/// A leaf module that is one matrix product x·Wᵀ by a [out, in] weight it holds other than as
/// a Linear (a head tied to the embedding's table, tensor parallelism's vocabulary-parallel
/// head): the weight, for counting its work (models/layers/flops.h).
class MatmulLeaf {
public:
  virtual ~MatmulLeaf() = default;
  virtual torch::Tensor matmul_weight() const = 0;
};

/// An embedding whose word table tensor parallelism may split over the vocabulary, as
/// Megatron's VocabParallelEmbedding and torchtitan's row-wise embedding do: it keeps rows
/// [first, first + rows) of the table, looks up the tokens that fall there (the others give
/// zeros) and hands that partial lookup to `sum`, which adds the members' (an all-reduce over
/// the tensor-parallel group, whose backward passes the gradient through).
class VocabSlots {
public:
  virtual ~VocabSlots() = default;
  virtual void split_vocabulary(int64_t first, int64_t rows,
                                std::function<torch::Tensor(const torch::Tensor&)> sum) = 0;
  /// Whether split_vocabulary ran: the word table is then this member's rows.
  virtual bool vocabulary_split() const = 0;
  /// The word table as this member holds it.
  virtual torch::Tensor word_table() const = 0;
};

/// The lookup of int64 `tokens` in `table`, the vocabulary's rows [first, first + rows):
/// zeros for the tokens outside them. Ops the meta device has (no masked_fill on 1.13's).
inline torch::Tensor lookup_vocab_range(const torch::Tensor& tokens, const torch::Tensor& table,
                                        int64_t first) {
  const int64_t rows = table.size(0);
  const torch::Tensor local = tokens - first;
  const torch::Tensor mine =
      local.ge(0).to(table.scalar_type()) * local.lt(rows).to(table.scalar_type());
  return torch::nn::functional::embedding(local.clamp(0, rows - 1), table) * mine.unsqueeze(-1);
}

} // namespace meshsim
