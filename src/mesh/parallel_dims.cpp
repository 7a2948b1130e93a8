// The named parallel dimensions: validation of the sizes and every derived group (rank order
// and group table in parallel_dims.h).
#include "mesh/parallel_dims.h"

#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h> // fmt::join (in fmt/format.h before fmt 11)

namespace meshsim {
namespace {

void require_positive(const char* flag, int value) {
  if (value < 1)
    throw std::invalid_argument(fmt::format("{} must be at least 1, got {}", flag, value));
}

} // namespace

ParallelDims ParallelDims::make(int world, int tp, int pp, int cp) {
  ParallelSizes sizes;
  sizes.world = world;
  sizes.tp = tp;
  sizes.pp = pp;
  sizes.cp = cp;
  return make(sizes);
}

ParallelDims ParallelDims::make(const ParallelSizes& s) {
  require_positive("--tp", s.tp);
  require_positive("--pp", s.pp);
  require_positive("--cp", s.cp);
  require_positive("--ep", s.ep);
  require_positive("--gpus", s.world);
  if (s.dp_shard < 0)
    throw std::invalid_argument(fmt::format("--dp-shard must be at least 1, got {}", s.dp_shard));
  const int64_t model = int64_t{s.tp} * s.pp * s.cp;  // ranks that hold one replica
  if (s.world % model != 0)
    throw std::invalid_argument(
        s.cp == 1 ? fmt::format("--gpus {} is not divisible by --tp {} × --pp {} = {}", s.world,
                                s.tp, s.pp, model)
                  : fmt::format("--gpus {} is not divisible by --tp {} × --pp {} × --cp {} = {}",
                                s.world, s.tp, s.pp, s.cp, model));
  ParallelDims d;
  d.world = s.world;
  d.tp = s.tp;
  d.pp = s.pp;
  d.cp = s.cp;
  d.ep = s.ep;
  d.dp = static_cast<int>(s.world / model);
  d.dp_shard = s.dp_shard == 0 ? d.dp : s.dp_shard;
  if (d.dp % d.dp_shard != 0)
    throw std::invalid_argument(fmt::format(
        "--dp-shard {} does not divide the {} data-parallel ranks", d.dp_shard, d.dp));
  d.dp_replicate = d.dp / d.dp_shard;
  if ((int64_t{d.dp_shard} * d.cp) % d.ep != 0)
    throw std::invalid_argument(fmt::format("--ep {} does not divide dp_shard {} × --cp {} = {}",
                                            d.ep, d.dp_shard, d.cp, int64_t{d.dp_shard} * d.cp));
  return d;
}

ParallelCoord ParallelDims::coord(int rank) const {
  ParallelCoord c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  return c;
}

int ParallelDims::rank(const ParallelCoord& c) const {
  return ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp;
}

Group ParallelDims::group(int r, std::string_view name) const {
  // The rank as (pp, dp_replicate, j, tp) with j its index among the dp_shard · cp ranks of
  // its replica: j = dp_shard_index · cp + cp_index = ep_outer · ep + ep_index.
  const int span = dp_shard * cp;
  const int t = r % tp, j = (r / tp) % span, rep = (r / (tp * span)) % dp_replicate;
  const int p = r / (tp * span * dp_replicate);
  const int shard = j / cp, c = j % cp, outer = j / ep, e = j % ep;
  Group g;
  auto add = [&](int pp_i, int rep_i, int j_i, int tp_i) {
    g.ranks.push_back(((pp_i * dp_replicate + rep_i) * span + j_i) * tp + tp_i);
  };
  if (name == "tp") {
    for (int i = 0; i < tp; ++i) add(p, rep, j, i);
  } else if (name == "cp") {
    for (int i = 0; i < cp; ++i) add(p, rep, shard * cp + i, t);
  } else if (name == "pp") {
    for (int i = 0; i < pp; ++i) add(i, rep, j, t);
  } else if (name == "dp_replicate") {
    for (int i = 0; i < dp_replicate; ++i) add(p, i, j, t);
  } else if (name == "dp_shard") {
    for (int i = 0; i < dp_shard; ++i) add(p, rep, i * cp + c, t);
  } else if (name == "dp") {
    for (int i = 0; i < dp_replicate; ++i)
      for (int k = 0; k < dp_shard; ++k) add(p, i, k * cp + c, t);
  } else if (name == "dp_shard_cp") {
    for (int k = 0; k < span; ++k) add(p, rep, k, t);
  } else if (name == "dp_cp") {
    for (int i = 0; i < dp_replicate; ++i)
      for (int k = 0; k < span; ++k) add(p, i, k, t);
  } else if (name == "ep") {
    for (int i = 0; i < ep; ++i) add(p, rep, outer * ep + i, t);
  } else if (name == "edp") {
    for (int i = 0; i < dp_replicate; ++i)
      for (int k = 0; k < span / ep; ++k) add(p, i, k * ep + e, t);
  } else {
    throw std::invalid_argument(fmt::format("unknown parallel group '{}' (one of {})", name,
                                            fmt::join(group_names(), ", ")));
  }
  return g;
}

Group ParallelDims::embedding_group(int r) const {
  const ParallelCoord c = coord(r);
  Group g;
  if (c.pp != 0 && c.pp != pp - 1) return g;  // a middle stage holds neither copy
  ParallelCoord first = c, last = c;
  first.pp = 0;
  last.pp = pp - 1;
  g.ranks.push_back(rank(first));
  if (pp > 1) g.ranks.push_back(rank(last));
  return g;
}

int ParallelDims::size(std::string_view name) const {
  if (name == "tp") return tp;
  if (name == "cp") return cp;
  if (name == "pp") return pp;
  if (name == "dp_replicate") return dp_replicate;
  if (name == "dp_shard") return dp_shard;
  if (name == "dp") return dp;
  if (name == "dp_shard_cp") return dp_shard * cp;
  if (name == "dp_cp") return dp * cp;
  if (name == "ep") return ep;
  if (name == "edp") return dp * cp / ep;
  return group(0, name).size();  // throws: the one message for an unknown name
}

const std::vector<std::string>& ParallelDims::group_names() {
  static const std::vector<std::string> names{"tp", "cp", "pp", "dp_replicate", "dp_shard",
                                              "dp", "dp_shard_cp", "dp_cp", "ep", "edp"};
  return names;
}

std::string ParallelDims::describe() const {
  std::string dp_part = fmt::format("dp={}", dp);
  if (dp_replicate > 1)
    dp_part += fmt::format(" (replicate {} × shard {})", dp_replicate, dp_shard);
  if (cp > 1) dp_part += fmt::format(" × cp={}", cp);
  std::string text = fmt::format("{} × tp={} × pp={}", dp_part, tp, pp);
  if (ep > 1) text += fmt::format(", ep={}", ep);
  return text;
}

} // namespace meshsim
