// ParallelDims: how the world's ranks are laid out in named parallel dimensions, and the
// groups each rank belongs to. One place validates the sizes and computes every group.
//
// The dimensions, as torchtitan names them: pp (pipeline stages), dp = dp_replicate ×
// dp_shard (data parallel; HSDP shards within dp_shard ranks and replicates across
// dp_replicate), cp (context parallel: each rank of a cp group holds a part of the sequence),
// tp (tensor parallel). Rank order, slowest to fastest: pp, dp_replicate, dp_shard, cp, tp:
//
//   rank = ((pp_index · dp + dp_index) · cp + cp_index) · tp + tp_index,
//   dp_index = dp_replicate_index · dp_shard + dp_shard_index
//
// so the members of a tensor-parallel group are neighbours (on a real node they share NVLink,
// which their per-layer all-reduces need most), and a pipeline stage is a contiguous block of
// dp · cp · tp ranks. With cp = 1 and dp_replicate = 1 this is Megatron-LM's order, tp fastest,
// then dp, then pp: with 8 GPUs and dp=2, tp=2, pp=2, stage 0 is ranks 0-3, stage 1 ranks 4-7;
// tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7}; pp groups {0,4} {1,5}
// {2,6} {3,7}.
//
// Expert parallelism is carved out of dp_shard × cp, as torchtitan and Megatron-core do: the
// dp_shard · cp ranks with one (pp, dp_replicate, tp) index, in rank order, split into groups
// of ep consecutive ranks ("ep": they hold different experts and exchange tokens), and the
// ranks at one position of those groups form "edp" (expert data parallel, with the replicas:
// dp · cp / ep ranks that hold the same experts and reduce their gradients).
//
// Derived groups, by name (group(rank, name)); members in rank order, which is the index
// order of the dimension:
//   tp, cp, pp, dp_replicate, dp_shard   one dimension
//   dp            dp_replicate × dp_shard: ranks that read different data (the batch)
//   dp_shard_cp   dp_shard × cp: what FSDP shards parameters over (with context parallelism)
//   dp_cp         dp_replicate × dp_shard × cp: the loss and the dense parameters' gradients
//   ep, edp       expert parallel, and expert data parallel (ep × edp = dp_cp)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"

namespace meshsim {

/// The sizes asked for; ParallelDims::make validates them once.
struct ParallelSizes {
  int world = 1;
  int tp = 1, pp = 1, cp = 1, ep = 1;
  int dp_shard = 0;  // 0: all of dp (dp_replicate = 1), as FSDP without HSDP
};

/// A rank's index in each dimension (dp is dp_replicate × dp_shard's index).
struct ParallelCoord {
  int dp = 0, tp = 0, pp = 0, cp = 0;
};

struct ParallelDims {
  int world = 1, dp = 1, tp = 1, pp = 1;
  int cp = 1, dp_replicate = 1, dp_shard = 1, ep = 1;  // dp = dp_replicate · dp_shard

  /// dp = world / (tp · pp · cp). Throws std::invalid_argument with a one-line message when a
  /// size is not positive, world is not divisible by tp · pp · cp, dp_shard does not divide
  /// dp, or ep does not divide dp_shard · cp.
  static ParallelDims make(const ParallelSizes& sizes);
  /// make({world, tp, pp, cp}): ep = 1, dp_shard = dp.
  static ParallelDims make(int world, int tp, int pp, int cp = 1);

  ParallelCoord coord(int rank) const;
  int rank(const ParallelCoord& c) const;

  /// The group called `name` (the table above) that `rank` belongs to. Throws
  /// std::invalid_argument for an unknown name.
  Group group(int rank, std::string_view name) const;
  /// The size of every group called `name`.
  int size(std::string_view name) const;
  /// Every name group() knows.
  static const std::vector<std::string>& group_names();

  /// Megatron's embedding group: the first and the last pipeline stage's ranks with the same
  /// dp, cp and tp index as `rank`, which hold the two copies of a tied word embedding (the
  /// embedding, and the head's copy) and sum their gradients. With one stage, the rank alone;
  /// a middle stage's rank is in none (an empty group). Not one of group_names(): its groups
  /// do not cover the world.
  Group embedding_group(int rank) const;

  /// The groups of `rank`, each in index order of its dimension.
  Group tp_group(int rank) const { return group(rank, "tp"); }
  Group dp_group(int rank) const { return group(rank, "dp"); }
  Group pp_group(int rank) const { return group(rank, "pp"); }

  /// "dp=2 × tp=2 × pp=2"; cp, HSDP and ep appear when they are not 1.
  std::string describe() const;
};

} // namespace meshsim
