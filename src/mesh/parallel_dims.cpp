// The dp × tp × pp layout (rank order documented in parallel_dims.h).
#include "mesh/parallel_dims.h"

#include <stdexcept>

#include <fmt/format.h>

namespace meshsim {

ParallelDims ParallelDims::make(int world, int tp, int pp) {
  if (tp < 1) throw std::invalid_argument(fmt::format("--tp must be at least 1, got {}", tp));
  if (pp < 1) throw std::invalid_argument(fmt::format("--pp must be at least 1, got {}", pp));
  if (world % (tp * pp) != 0)
    throw std::invalid_argument(fmt::format(
        "--gpus {} is not divisible by --tp {} × --pp {} = {}", world, tp, pp, tp * pp));
  return ParallelDims{world, world / (tp * pp), tp, pp};
}

ParallelCoord ParallelDims::coord(int rank) const {
  return ParallelCoord{(rank / tp) % dp, rank % tp, rank / (dp * tp)};
}

int ParallelDims::rank(const ParallelCoord& c) const { return c.pp * dp * tp + c.dp * tp + c.tp; }

Group ParallelDims::tp_group(int r) const {
  ParallelCoord c = coord(r);
  Group g;
  for (c.tp = 0; c.tp < tp; ++c.tp) g.ranks.push_back(rank(c));
  return g;
}

Group ParallelDims::dp_group(int r) const {
  ParallelCoord c = coord(r);
  Group g;
  for (c.dp = 0; c.dp < dp; ++c.dp) g.ranks.push_back(rank(c));
  return g;
}

Group ParallelDims::pp_group(int r) const {
  ParallelCoord c = coord(r);
  Group g;
  for (c.pp = 0; c.pp < pp; ++c.pp) g.ranks.push_back(rank(c));
  return g;
}

std::string ParallelDims::describe() const {
  return fmt::format("dp={} × tp={} × pp={}", dp, tp, pp);
}

} // namespace meshsim
