// ParallelDims: how the world's ranks are laid out as dp × tp × pp, and the groups each rank
// belongs to.
//
// Rank order, as Megatron-LM lays it out: tensor parallel fastest, then data parallel, then
// pipeline parallel:
//
//   rank = pp_index · (dp · tp) + dp_index · tp + tp_index
//
// so the members of a tensor-parallel group are neighbours (on a real node they share NVLink,
// which their per-layer all-reduces need most), and a pipeline stage is a contiguous block of
// dp · tp ranks. With 8 GPUs and dp=2, tp=2, pp=2: stage 0 is ranks 0-3, stage 1 ranks 4-7;
// tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7}; pp groups {0,4} {1,5}
// {2,6} {3,7}.
#pragma once

#include <string>

#include "comm/communicator.h"

namespace meshsim {

struct ParallelCoord {
  int dp = 0, tp = 0, pp = 0;
};

struct ParallelDims {
  int world = 1, dp = 1, tp = 1, pp = 1;

  /// dp = world / (tp · pp). Throws std::invalid_argument with a one-line message when the
  /// sizes are not positive or world is not divisible by tp · pp.
  static ParallelDims make(int world, int tp, int pp);

  ParallelCoord coord(int rank) const;
  int rank(const ParallelCoord& c) const;

  /// The groups of `rank`, each in index order of its dimension.
  Group tp_group(int rank) const;
  Group dp_group(int rank) const;
  Group pp_group(int rank) const;

  /// "dp=2 × tp=2 × pp=2"
  std::string describe() const;
};

} // namespace meshsim
