// search_layouts and estimate_layout. See search.h.
#include "plan/search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "memory/category.h"
#include "models/family.h"
#include "models/presets.h"
#include "parallel/pipeline/schedule.h"

namespace meshsim {
namespace {

std::string describe(const TrainConfig& c) {
  return fmt::format("tp {}{} pp {} dp {}{} zero {} mbs {} recompute {}{}", c.tp,
                     c.cp > 1 ? fmt::format(" cp {} ({})", c.cp, c.cp_comm) : "", c.pp,
                     c.gpus / (c.tp * c.pp * c.cp),
                     c.dp_shard > 0 ? fmt::format(" (shard {})", c.dp_shard) : "", c.zero,
                     micro_batch_size_of(c), c.recompute, c.sequence_parallel ? " sp" : "");
}

// A family of the search: one tp × cp × pp (and the context-parallel exchange).
struct FamilyShape {
  int tp = 1, cp = 1, pp = 1;
  std::string cp_comm = "allgather";
  /// The estimate of the family's gate (gate_candidate), where choosing the exchange made it.
  std::optional<PlanFigures> gate;
};

std::string describe(const FamilyShape& f) {
  return f.cp > 1 ? fmt::format("tp {}, cp {} ({}), pp {}", f.tp, f.cp, f.cp_comm, f.pp)
                  : fmt::format("tp {}, pp {}", f.tp, f.pp);
}

// `base` laid out as one candidate of the search (validate() still to run).
// How a candidate shards ZeRO's state: its stage, and HSDP's shard groups (0: all of dp).
struct Sharding {
  int zero = 0;
  int dp_shard = 0;
};

TrainConfig candidate(const TrainConfig& base, int world, const FamilyShape& shape,
                      Sharding sharding, bool sp, int64_t micro_batch_size, const char* recompute) {
  TrainConfig c = base;
  c.gpus = world;
  c.tp = shape.tp;
  c.pp = shape.pp;
  c.cp = shape.cp;
  c.cp_comm = shape.cp_comm;
  c.zero = sharding.zero;
  c.dp_shard = sharding.dp_shard;
  c.reshard_after_forward = true;
  c.micro_batch_size = micro_batch_size;
  c.micro_batches = 0;
  c.sequence_parallel = sp;
  c.recompute = recompute;
  c.schedule = "1f1b";
  c.virtual_stages = 1; // the search plans plain 1F1B
  c.first_stage_layers = c.last_stage_layers = 0; // and even stages: its own pp
  c.stage_layers.clear();
  return c;
}

// The family's first candidate, the one that holds the least: ZeRO 3 over all of dp × cp,
// sequence parallelism where tp > 1, one sample per micro-batch, full recompute.
TrainConfig gate_candidate(const TrainConfig& base, int world, const FamilyShape& shape) {
  return candidate(base, world, shape, {3, 0}, shape.tp > 1, 1, "full");
}

// A (tp, pp) family while it is searched: what the search reports if nothing of it fits, and
// the least memory any of its candidates needs.
struct Family {
  RejectedFamily report;
  int64_t least_bytes = -1;
  std::string least; // "<layout> peaks at X" or "... holds a model state of at least X"

  void note(int64_t bytes, const TrainConfig& c, bool model_state_alone) {
    if (least_bytes >= 0 && bytes >= least_bytes)
      return;
    least_bytes = bytes;
    least = fmt::format("{} {} {}", describe(c),
                        model_state_alone ? "holds a model state of at least" : "peaks at",
                        format_bytes(bytes));
  }
  void refuse(const std::string& why) {
    if (report.reason.empty())
      report.reason = "does not divide: " + why;
  }
};

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

// The families, in order: tp a power of two within a node; for a transformer, cp a power of
// two whose 2·cp chunks each keep at least kMinContextChunk tokens (a rank 2048 or more: below
// that the exchange of K and V outweighs the attention it splits), with either exchange;
// every pipeline depth that divides the GPUs left.
constexpr int64_t kMinContextChunk = 1024;

std::vector<FamilyShape> family_shapes(const TrainConfig& base, const ClusterSpec& cluster) {
  const int world = cluster.world_size();
  const bool sequence = model_family(base.model).transformer;
  std::vector<FamilyShape> shapes;
  for (int tp = 1; tp <= cluster.gpus_per_node; tp *= 2) {
    if (world % tp != 0)
      continue;
    for (int cp = 1; world % (tp * cp) == 0; cp *= 2) {
      if (cp > 1 && (!sequence || base.shape.seq_len % (2 * cp) != 0 ||
                     base.shape.seq_len / (2 * cp) < kMinContextChunk))
        break;
      for (const char* comm : {"allgather", "ring"}) {
        if (cp == 1 && std::string(comm) == "ring")
          continue;
        for (int pp : divisors(world / (tp * cp)))
          shapes.push_back({tp, cp, pp, comm, std::nullopt});
      }
    }
  }
  return shapes;
}

} // namespace

namespace {

// fn(i) for every i < n, on `workers` threads at once (this one among them); an exception of
// any call is rethrown here, after all have ended.
void for_each_at_once(size_t n, int workers, const std::function<void(size_t)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers && static_cast<size_t>(w) < n; ++w)
    threads.emplace_back(work);
  work();
  for (std::thread& t : threads)
    t.join();
  for (const std::exception_ptr& e : errors)
    if (e)
      std::rethrow_exception(e);
}

// The fitting layouts, fastest first; the best `options.confirm` estimates planned in full
// (one that no longer fits leaves the list); at most `options.top` of them.
std::vector<Layout> confirm_best(std::vector<Layout> fitting, const ClusterSpec& cluster,
                                 const SearchOptions& options, int workers) {
  auto faster = [](const Layout& a, const Layout& b) {
    return a.figures.tokens_per_s_per_gpu > b.figures.tokens_per_s_per_gpu;
  };
  std::stable_sort(fitting.begin(), fitting.end(), faster);
  // The best `confirm` planned in full at once.
  const size_t confirm = std::min(fitting.size(), static_cast<size_t>(std::max(options.confirm, 0)));
  for_each_at_once(confirm, workers, [&](size_t i) {
    Layout& l = fitting[i];
    l.estimated_step_seconds = l.figures.step_seconds;
    l.figures = plan_on(l.config, cluster);
    l.confirmed = true;
  });
  fitting.erase(std::remove_if(fitting.begin(), fitting.end(),
                               [](const Layout& l) { return l.confirmed && !l.figures.fits; }),
                fitting.end());
  std::stable_sort(fitting.begin(), fitting.end(), faster);
  if (fitting.size() > static_cast<size_t>(options.top))
    fitting.resize(static_cast<size_t>(options.top));
  return fitting;
}

// The families with no fitting layout, each with why: every candidate refused, or the least
// memory any of them needs over the GPU's.
std::vector<RejectedFamily> rejected_families(std::vector<Family>& families, int64_t memory) {
  std::vector<RejectedFamily> rejected;
  for (Family& f : families) {
    if (f.least_bytes < 0) { // every candidate refused
      rejected.push_back(f.report);
    } else if (f.least_bytes > memory) {
      f.report.reason =
          fmt::format("does not fit: at the least, {}, over {}", f.least, format_bytes(memory));
      rejected.push_back(f.report);
    }
  }
  return rejected;
}

} // namespace

namespace {

// One family's part of the search: its candidates, counted; the layouts of it that fit.
struct FamilyOutcome {
  Family family;
  std::vector<Layout> fitting;
  int candidates = 0, invalid = 0, planned = 0;
};

// What the families being searched at once share: the progress callback and its counts.
class SearchProgress {
public:
  explicit SearchProgress(const SearchOptions& options) : options_(options) {}
  void layout_planned(int n = 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    planned_ += n;
  }
  void layout_fits() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++fitting_;
    if (options_.progress)
      options_.progress(planned_, fitting_);
  }

private:
  const SearchOptions& options_;
  std::mutex mutex_;
  int planned_ = 0, fitting_ = 0;
};

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

// One family: for each sequence-parallel choice and micro-batch size, the least ZeRO sharding
// that fits (sharding more only adds communication), and with it the least recompute that
// fits (recomputing more never makes a step faster).
FamilyOutcome search_family(const TrainConfig& base, const ClusterSpec& cluster,
                            const FamilyShape& shape, int64_t memory, SearchProgress& progress) {
  const int world = cluster.world_size();
  FamilyOutcome out;
  Family& family = out.family;
  family.report.family = describe(shape);
  const std::vector<Sharding> zeros = family_shardings(shape, world, cluster.gpus_per_node);
  const std::vector<bool> sps =
      shape.tp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{false};
  const int per_size = static_cast<int>(zeros.size()) * 3;
  if (base.shape.layers % shape.pp != 0) { // Megatron's 1F1B needs equal stages too
    const int count = static_cast<int>(sps.size()) * 4 * per_size;
    out.candidates += count;
    out.invalid += count;
    family.report.candidates += count;
    family.refuse(fmt::format("{} layers do not split into {} equal stages", base.shape.layers,
                              shape.pp));
    return out;
  }
  // Under the fused core selective recomputation changes nothing (models/layers/attention.h):
  // only none and full are planned.
  const bool fused = model_family(base.model).transformer && base.attention == "fused";
  std::vector<const char*> lighter{"none"};
  if (!fused)
    lighter.push_back("selective");

  // The estimate of `c` (validated), noted for the family's report.
  auto estimate = [&](const TrainConfig& c) {
    ++out.planned;
    progress.layout_planned();
    const PlanFigures f = estimate_layout(c, cluster, memory);
    family.note(f.peak_bytes, c, false);
    return f;
  };
  // Most memory saved first: when ZeRO 3 with sequence parallelism, one sample per
  // micro-batch and full recompute does not fit, nothing in the family does.
  bool gate_checked = false;
  std::optional<PlanFigures> most_figures; // the gate's estimate, if it made one
  for (bool sp : sps) {
    double previous = 0; // tokens/s of the last micro-batch size that fit
    bool sizes_done = false;
    for (int64_t mbs : {1, 2, 4, 8}) {
      out.candidates += per_size;
      family.report.candidates += per_size;
      // The candidates with full recompute, least sharding first; the invalid ones counted.
      std::vector<TrainConfig> valid;
      for (auto z = zeros.rbegin(); z != zeros.rend(); ++z) {
        TrainConfig least = candidate(base, world, shape, *z, sp, mbs, "full");
        try {
          validate(least);
          check_plan_work(least, kPlanSteps); // the best are planned in full below
          valid.push_back(std::move(least));
        } catch (const std::invalid_argument& e) {
          out.invalid += 3;
          family.refuse(e.what());
        }
      }
      if (sizes_done || valid.empty())
        continue;
      if (!gate_checked) {
        gate_checked = true;
        const TrainConfig& most = valid.back();
        const bool most_saving = most.zero == zeros.front().zero &&
                                 most.dp_shard == zeros.front().dp_shard && sp == sps.front();
        const int64_t floor = model_state_floor(most);
        if (floor > memory) {
          family.note(floor, most, true);
          if (most_saving)
            return out;
        } else if (most_saving) {
          if (shape.gate && micro_batch_size_of(most) == 1) { // estimated already
            ++out.planned;
            progress.layout_planned();
            family.note(shape.gate->peak_bytes, most, false);
            most_figures = *shape.gate;
          } else {
            most_figures = estimate(most);
          }
          if (!most_figures->fits)
            return out;
        }
      }
      // The least sharding whose full recompute fits; none fitting at this size, none fits at
      // a larger one (it holds more).
      std::optional<Layout> chosen;
      for (const TrainConfig& least : valid) {
        const int64_t floor = model_state_floor(least);
        if (floor > memory) { // the model state alone: no plan needed
          family.note(floor, least, true);
          continue;
        }
        const PlanFigures f =
            most_figures && &least == &valid.back() ? *most_figures : estimate(least);
        if (!f.fits)
          continue;
        chosen = Layout{least, f, false};
        for (const char* level : lighter) {
          TrainConfig c = least;
          c.recompute = level;
          validate(c);
          const PlanFigures g = estimate(c);
          if (g.fits) {
            chosen = Layout{c, g, false};
            break;
          }
        }
        break;
      }
      most_figures.reset();
      if (!chosen) {
        sizes_done = true;
        continue;
      }
      const double rate = chosen->figures.tokens_per_s_per_gpu;
      out.fitting.push_back(std::move(*chosen));
      progress.layout_fits();
      // A larger micro-batch holds more; once one is slower than the size before it (a
      // longer pipeline bubble outweighing fewer, larger kernels), stop.
      sizes_done = rate < previous;
      previous = rate;
    }
  }
  return out;
}

// Runs search_family for every shape on `workers` threads at once; the outcomes in the
// shapes' order, whatever order they finished in. A family's exception is rethrown here.
std::vector<FamilyOutcome> search_families(const TrainConfig& base, const ClusterSpec& cluster,
                                           const std::vector<FamilyShape>& shapes,
                                           int64_t memory, const SearchOptions& options,
                                           int workers) {
  std::vector<FamilyOutcome> outcomes(shapes.size());
  SearchProgress progress(options);
  for_each_at_once(shapes.size(), workers, [&](size_t i) {
    outcomes[i] = search_family(base, cluster, shapes[i], memory, progress);
  });
  return outcomes;
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
  std::vector<size_t> gated; // shapes whose gate is estimated here
  for (const auto& [ag, ring] : pairs) {
    TrainConfig c = gate_candidate(base, world, shapes[ag]);
    try {
      validate(c);
      check_plan_work(c, kPlanSteps);
    } catch (const std::invalid_argument&) {
      continue; // the family search reports why
    }
    if (base.shape.layers % c.pp != 0 || model_state_floor(c) > memory)
      continue;
    gated.push_back(ag);
    gated.push_back(ring);
  }
  for_each_at_once(gated.size(), workers, [&](size_t i) {
    TrainConfig c = gate_candidate(base, world, shapes[gated[i]]);
    validate(c);
    shapes[gated[i]].gate = estimate_layout(c, cluster, memory);
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

} // namespace

SearchResult search_layouts(const TrainConfig& base, const ClusterSpec& cluster,
                            const SearchOptions& options) {
  if (base.global_batch_size <= 0)
    throw std::invalid_argument("meshsim plan --search needs --global-batch-size (the batch every "
                                "layout must train on)");
  const auto memory = static_cast<int64_t>(cluster.gpu.mem_bytes);
  const int workers = options.workers > 0
                          ? options.workers
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  SearchResult result;
  const std::vector<FamilyShape> shapes = choose_exchanges(
      base, cluster, family_shapes(base, cluster), memory, workers, result.allgather_skipped);
  std::vector<FamilyOutcome> outcomes =
      search_families(base, cluster, shapes, memory, options, workers);

  std::vector<Layout> fitting;
  std::vector<Family> families;
  for (FamilyOutcome& o : outcomes) {
    result.candidates += o.candidates;
    result.invalid += o.invalid;
    result.planned += o.planned;
    for (Layout& l : o.fitting)
      fitting.push_back(std::move(l));
    families.push_back(std::move(o.family));
  }
  result.fitting = static_cast<int>(fitting.size());
  result.best = confirm_best(std::move(fitting), cluster, options, workers);
  result.rejected = rejected_families(families, memory);
  return result;
}

} // namespace meshsim
