// search_layouts. See search.h.
#include "plan/search.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "base/bytes.h"
#include "base/for_each_at_once.h"
#include "models/family.h"
#include "plan/search_space.h"

namespace meshsim {
namespace {

using search::FamilyShape;
using search::Sharding;
using search::candidate;
using search::choose_exchanges;
using search::describe;
using search::family_shapes;
using search::family_shardings;

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

// What did not fit already, by sharding and recompute: a layout holds at least what one with
// a smaller micro-batch, or with sequence parallelism, held at the same sharding and
// recompute (its activations only grow), so it is not estimated again.
class Overflows {
public:
  void add(const TrainConfig& c) {
    const int64_t mbs = micro_batch_size_of(c);
    auto [it, inserted] = least_.emplace(key(c), mbs);
    if (!inserted)
      it->second = std::min(it->second, mbs);
  }
  // Whether `c` holds at least what a layout that did not fit held: the same sharding and
  // recompute at a micro-batch no larger (visited with sequence parallelism, or as `c`).
  bool holds(const TrainConfig& c) const {
    const auto it = least_.find(key(c));
    return it != least_.end() && it->second <= micro_batch_size_of(c);
  }

private:
  static std::tuple<int, int, std::string> key(const TrainConfig& c) {
    return {c.zero, c.dp_shard, c.recompute};
  }
  std::map<std::tuple<int, int, std::string>, int64_t> least_; // -> smallest micro-batch
};

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
  // A mixture of experts does not take sequence parallelism (its layers route whole sequences).
  const std::vector<bool> sps = shape.tp > 1 && base.shape.moe.experts == 0
                                    ? std::vector<bool>{true, false}
                                    : std::vector<bool>{false};
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

  // `f`, the estimate of `c`, counted and noted for the family's report.
  auto noted = [&](const TrainConfig& c, const PlanFigures& f) {
    ++out.planned;
    progress.layout_planned();
    family.note(f.peak_bytes, c, false);
    return f;
  };
  // The estimate of `c` (validated), noted.
  auto estimate = [&](const TrainConfig& c) {
    return noted(c, estimate_layout(c, cluster, memory));
  };
  // Most memory saved first: when ZeRO 3 with sequence parallelism, one sample per
  // micro-batch and full recompute does not fit, nothing in the family does.
  bool gate_checked = false;
  std::optional<PlanFigures> most_figures; // the gate's estimate, if it made one
  // The sizes are visited in increasing order, sequence parallelism first: what overflowed at
  // a visited size overflows at every later one of the same sp, and of sp off.
  Overflows overflows;
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
          // The gate, unless choosing the exchange estimated it already.
          most_figures = shape.gate && micro_batch_size_of(most) == 1 ? noted(most, *shape.gate)
                                                                      : estimate(most);
          if (!most_figures->fits)
            return out;
        }
      }
      // The least sharding whose full recompute fits; none fitting at this size, none fits at
      // a larger one (it holds more). Then the lightest recompute that fits at it, or, where
      // none does, at the next shardings: sharding more adds communication, but recomputing
      // less saves more (a third of the FLOPs), so the first sharding that fits a lighter
      // recompute is weighed against full recompute with less sharding.
      std::optional<Layout> chosen;
      // The lightest recompute of `least` (validated, its full recompute fits) that fits.
      auto lightest = [&](const TrainConfig& least) -> std::optional<Layout> {
        for (const char* level : lighter) {
          TrainConfig c = least;
          c.recompute = level;
          if (overflows.holds(c)) // before validating it: the same sizes as `least`
            continue;
          validate(c);
          const PlanFigures g = estimate(c);
          if (g.fits)
            return Layout{c, g, false};
          overflows.add(c);
        }
        return std::nullopt;
      };
      for (const TrainConfig& least : valid) {
        const int64_t floor = model_state_floor(least);
        if (floor > memory) { // the model state alone: no plan needed
          family.note(floor, least, true);
          continue;
        }
        const bool gate = most_figures && &least == &valid.back();
        if (!chosen && !gate && overflows.holds(least))
          continue;
        if (!chosen) {
          const PlanFigures f = gate ? *most_figures : estimate(least);
          if (!f.fits) {
            overflows.add(least);
            continue;
          }
          chosen = Layout{least, f, false};
        }
        std::optional<Layout> light = lightest(least);
        if (!light)
          continue; // full recompute only, so far: try the next sharding lighter
        if (chosen->config.recompute == std::string("full") ||
            light->figures.tokens_per_s_per_gpu > chosen->figures.tokens_per_s_per_gpu)
          chosen = std::move(light);
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
