// The search's space: its families, their candidates and shardings, and the choice of
// context-parallel exchange. See search_space.h.
#include "plan/search_space.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "base/for_each_at_once.h"
#include "models/family.h"
#include "plan/estimate.h"

namespace meshsim::search {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

} // namespace

// The families, in order: tp a power of two within a node; for a transformer, cp a power of
// two whose 2·cp chunks each keep at least kMinContextChunk tokens (a rank 2048 or more: below
// that the exchange of K and V outweighs the attention it splits), with either exchange;
// every pipeline depth that divides the GPUs left. --no-loss-upcast runs at tp 1 only.
constexpr int64_t kMinContextChunk = 1024;

std::vector<FamilyShape> family_shapes(const TrainConfig& base, const ClusterSpec& cluster) {
  const int world = cluster.world_size();
  const bool sequence = model_family(base.model).transformer;
  const int largest_tp = base.loss_upcast ? cluster.gpus_per_node : 1;
  std::vector<FamilyShape> shapes;
  for (int tp = 1; tp <= largest_tp; tp *= 2) {
    if (world % tp != 0)
      continue;
    for (int cp = 1; world % (tp * cp) == 0; cp *= 2) {
      if (cp > 1 && (!sequence || base.shape.seq_len % (2 * cp) != 0 ||
                     base.shape.seq_len / (2 * cp) < kMinContextChunk))
        break;
      for (const char* comm : {"allgather", "ring"}) {
        if (cp == 1 && std::string(comm) == "ring")
          continue;
        for (int pp : divisors(world / (tp * cp))) {
          const int64_t experts = base.shape.moe.experts, span = world / (tp * pp);
          // Expert parallelism only for a mixture of experts (0 experts divide by anything).
          for (int ep = 1; ep == 1 || (experts > 0 && experts % ep == 0 && span % ep == 0);
               ep *= 2)
            shapes.push_back({tp, cp, pp, comm, ep, std::nullopt});
        }
      }
    }
  }
  return shapes;
}


std::string describe(const FamilyShape& f) {
  const std::string ep = f.ep > 1 ? fmt::format(", ep {}", f.ep) : "";
  return f.cp > 1 ? fmt::format("tp {}, cp {} ({}), pp {}{}", f.tp, f.cp, f.cp_comm, f.pp, ep)
                  : fmt::format("tp {}, pp {}{}", f.tp, f.pp, ep);
}

TrainConfig candidate(const TrainConfig& base, int world, const FamilyShape& shape,
                      Sharding sharding, bool sp, int64_t micro_batch_size, const char* recompute) {
  TrainConfig c = base;
  c.gpus = world;
  c.tp = shape.tp;
  c.pp = shape.pp;
  c.cp = shape.cp;
  c.cp_comm = shape.cp_comm;
  c.ep = shape.ep;
  c.zero = sharding.zero;
  c.dp_shard = sharding.dp_shard;
  c.reshard_after_forward = true;
  c.reduce_fp32 = base.reduce_fp32 && sharding.zero >= 1; // where ZeRO reduces
  c.micro_batch_size = micro_batch_size;
  c.micro_batches = 0;
  c.sequence_parallel = sp;
  c.pp_scatter_gather = base.pp_scatter_gather && pipeline_messages_whole_on_tp(c);
  c.recompute = recompute;
  c.schedule = "1f1b";
  c.virtual_stages = 1; // the search plans plain 1F1B
  c.first_stage_layers = c.last_stage_layers = 0; // and even stages: its own pp
  c.stage_layers.clear();
  return c;
}

TrainConfig gate_candidate(const TrainConfig& base, int world, const FamilyShape& shape) {
  return candidate(base, world, shape, {3, 0}, shape.tp > 1 && base.shape.moe.experts == 0, 1,
                   "full");
}

std::string describe(const TrainConfig& c) {
  return fmt::format("tp {}{} pp {} dp {}{}{} zero {} mbs {} recompute {}{}", c.tp,
                     c.cp > 1 ? fmt::format(" cp {} ({})", c.cp, c.cp_comm) : "", c.pp,
                     c.gpus / (c.tp * c.pp * c.cp), c.ep > 1 ? fmt::format(" ep {}", c.ep) : "",
                     c.dp_shard > 0 ? fmt::format(" (shard {})", c.dp_shard) : "", c.zero,
                     micro_batch_size_of(c), c.recompute, c.sequence_parallel ? " sp" : "");
}

// fn(i) for every i < n, on `workers` threads at once (this one among them); an exception of
// any call is rethrown here, after all have ended.
// A family of candidates. Its ZeRO shardings, from the most to the least: ZeRO 3 over all of
// dp × cp; HSDP, ZeRO 3 sharded within a node's data-parallel ranks and replicated across
// nodes (its all-gathers stay on the node's links), where a node holds more than one and
// fewer than all of dp; ZeRO 2 without a pipeline (DeepSpeed refuses it with one: it would
// reduce-scatter every micro-batch and save only gradients); ZeRO 1 (Megatron's distributed
// optimizer) and 0.
std::vector<Sharding> family_shardings(const FamilyShape& shape, int world, int gpus_per_node) {
  const int dp = world / (shape.tp * shape.pp * shape.cp);
  const int node_dp = std::max(1, gpus_per_node / (shape.tp * shape.cp));
  std::vector<Sharding> zeros{{3, 0}};
  if (node_dp > 1 && node_dp < dp && dp % node_dp == 0)
    zeros.push_back({3, node_dp});
  for (int zero : {2, 1, 0})
    if (zero != 2 || shape.pp == 1)
      zeros.push_back({zero, 0});
  return zeros;
}

// The context-parallel exchange of each (tp, cp, pp), chosen before its families are searched:
// both are estimated at the family's gate. The ring keeps its own K/V block where the
// all-gather keeps the whole sequence's, so it fits wherever the all-gather does; where it is
// also at least as fast there, the all-gather's family is not searched. Both exchanges move
// K/V in proportion to the micro-batch and no ZeRO stage changes them, so their order at the
// gate is taken for the family's (a heuristic, as the micro-batch sizes' stop is). The shapes
// searched, with the gates estimated; `skipped` counts the all-gather families left out.
std::vector<FamilyShape> choose_exchanges(const TrainConfig& base, const ClusterSpec& cluster,
                                          std::vector<FamilyShape> shapes, int64_t memory,
                                          int workers, int& skipped) {
  const int world = cluster.world_size();
  std::vector<std::pair<size_t, size_t>> pairs; // (all-gather, ring) of one tp × cp × pp
  for (size_t i = 0; i < shapes.size(); ++i)
    for (size_t j = 0; j < shapes.size(); ++j)
      if (shapes[i].cp > 1 && shapes[i].cp_comm == "allgather" && shapes[j].cp_comm == "ring" &&
          shapes[j].tp == shapes[i].tp && shapes[j].cp == shapes[i].cp &&
          shapes[j].pp == shapes[i].pp)
        pairs.emplace_back(i, j);
  // The gates to estimate, each shape's built and validated once.
  std::vector<std::pair<size_t, TrainConfig>> gates;
  for (const auto& [ag, ring] : pairs) {
    TrainConfig a = gate_candidate(base, world, shapes[ag]);
    TrainConfig r = gate_candidate(base, world, shapes[ring]);
    try {
      validate(a);
      validate(r);
      check_plan_work(a, kPlanSteps);
    } catch (const std::invalid_argument&) {
      continue; // the family search reports why
    }
    if (base.shape.layers % a.pp != 0 || model_state_floor(a) > memory)
      continue;
    gates.emplace_back(ag, std::move(a));
    gates.emplace_back(ring, std::move(r));
  }
  for_each_at_once(gates.size(), workers, [&](size_t i) {
    shapes[gates[i].first].gate = estimate_layout(gates[i].second, cluster, memory);
  });
  std::vector<bool> skip(shapes.size(), false);
  for (const auto& [ag, ring] : pairs) {
    const auto &a = shapes[ag].gate, &r = shapes[ring].gate;
    if (a && r && r->fits && r->tokens_per_s_per_gpu >= a->tokens_per_s_per_gpu) {
      skip[ag] = true;
      ++skipped;
    }
  }
  std::vector<FamilyShape> out;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (!skip[i])
      out.push_back(std::move(shapes[i]));
  return out;
}

} // namespace meshsim::search
