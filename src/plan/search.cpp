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

// `a` measured at ta and `b` at tb, carried on linearly to t (a when the points coincide).
double line(double a, double b, double ta, double tb, double t) {
  return tb == ta ? a : a + (b - a) * (t - ta) / (tb - ta);
}

int64_t line_bytes(int64_t a, int64_t b, double ta, double tb, double t) {
  return std::llround(line(static_cast<double>(a), static_cast<double>(b), ta, tb, t));
}

// One entry per stage: the largest of a stage's tp ranks where they differ.
std::vector<StageFigures> per_stage(const std::vector<StageFigures>& stages) {
  std::vector<StageFigures> out;
  for (const StageFigures& s : stages) {
    if (!out.empty() && out.back().stage == s.stage) {
      if (s.peak_bytes > out.back().peak_bytes)
        out.back() = s;
      out.back().tp_rank = -1;
      continue;
    }
    out.push_back(s);
  }
  return out;
}

// Every extensive figure of `a` (measured at ta) and `b` (at tb) carried on to t. A stage's
// peak is the largest of its windows' (the phases between memory samples), and which phase
// peaks can change with the size (a phase that grows faster overtakes at more blocks), so
// where both plans have the same windows each window's peaks are carried on and the largest
// taken.
PlanFigures extrapolate(const PlanFigures& a, const PlanFigures& b, double ta, double tb, double t) {
  PlanFigures f = a;
  std::vector<StageFigures> sa = a.stages, sb = b.stages;
  if (sa.size() != sb.size()) // tp ranks alike at one size and not the other
    sa = per_stage(sa), sb = per_stage(sb);
  f.stages = sa;
  for (size_t i = 0; i < sa.size(); ++i) {
    StageFigures& s = f.stages[i];
    s.model_state_bytes = line_bytes(sa[i].model_state_bytes, sb[i].model_state_bytes, ta, tb, t);
    const auto& wa = sa[i].windows;
    const auto& wb = sb[i].windows;
    const bool windows = !wa.empty() && wa.size() == wb.size() &&
                         std::equal(wa.begin(), wa.end(), wb.begin(), [](const auto& x, const auto& y) {
                           return x.phase == y.phase;
                         });
    if (!windows) {
      s.windows.clear();
      s.peak_bytes = line_bytes(sa[i].peak_bytes, sb[i].peak_bytes, ta, tb, t);
      for (size_t c = 0; c < s.peak_by_category.size(); ++c)
        s.peak_by_category[c] =
            line_bytes(sa[i].peak_by_category[c], sb[i].peak_by_category[c], ta, tb, t);
      continue;
    }
    s.peak_bytes = 0;
    s.peak_by_category.fill(0);
    for (size_t w = 0; w < wa.size(); ++w) {
      PeakWindow& out = s.windows[w];
      out.stats.peak = line_bytes(wa[w].stats.peak, wb[w].stats.peak, ta, tb, t);
      s.peak_bytes = std::max(s.peak_bytes, out.stats.peak);
      for (size_t c = 0; c < s.peak_by_category.size(); ++c) {
        out.stats.peak_by_category[c] = line_bytes(wa[w].stats.peak_by_category[c],
                                                   wb[w].stats.peak_by_category[c], ta, tb, t);
        s.peak_by_category[c] = std::max(s.peak_by_category[c], out.stats.peak_by_category[c]);
      }
    }
  }
  f.tokens_per_step = line_bytes(a.tokens_per_step, b.tokens_per_step, ta, tb, t);
  f.step_seconds = line(a.step_seconds, b.step_seconds, ta, tb, t);
  f.flops = line(a.flops, b.flops, ta, tb, t);
  f.model_flops = line(a.model_flops, b.model_flops, ta, tb, t);
  derive_rates(f);
  return f;
}

// `config` with `blocks` transformer blocks per stage and `micro_batches` micro-batches of the
// same size, validated.
TrainConfig reduced(const TrainConfig& config, int64_t blocks, int micro_batches) {
  TrainConfig c = config;
  const int dp = config.gpus / (config.tp * config.pp * config.cp);
  const int64_t micro_batch_size = micro_batch_size_of(config);
  c.shape.layers = blocks * config.pp;
  c.micro_batch_size = micro_batch_size;
  c.micro_batches = 0;
  c.global_batch_size = micro_batch_size * dp * micro_batches;
  validate(c);
  return c;
}

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
};

std::string describe(const FamilyShape& f) {
  return f.cp > 1 ? fmt::format("tp {}, cp {} ({}), pp {}", f.tp, f.cp, f.cp_comm, f.pp)
                  : fmt::format("tp {}, pp {}", f.tp, f.pp);
}

// Per stage: the most micro-batches it holds at once with `micro_batches` under the
// configuration's schedule (one without a pipeline).
std::vector<int> held_at_once(const TrainConfig& config, int micro_batches) {
  if (config.pp == 1)
    return {1};
  return dry_run(make_schedule(config.schedule, config.pp, micro_batches, config.virtual_stages))
      .peak_in_flight;
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
          shapes.push_back({tp, cp, pp, comm});
      }
    }
  }
  return shapes;
}

} // namespace

PlanFigures estimate_layout(const TrainConfig& config, const ClusterSpec& cluster,
                            int64_t stop_above, const PredictOptions& target) {
  // Interleaved 1F1B (V chunks per stage) plans whole chunks of 1 and 2 blocks and a multiple
  // of the pipeline's depth of micro-batches, as its schedule needs: P and 2P.
  const int v = config.virtual_stages;
  const int64_t blocks = config.shape.layers / config.pp; // validate: layers divide by pp (and V)
  const int m = config.micro_batches;
  const int m1 = v > 1 ? config.pp : 1, m2 = 2 * m1;
  // Blocks: 1 and 2 per chunk (the embedding and head are the same in both).
  const int64_t k1 = std::min<int64_t>(blocks, v), k2 = std::min<int64_t>(blocks, 2 * v);
  auto at = [&](int64_t k, int micro) {
    return plan_on(reduced(config, k, micro), cluster, nullptr, nullptr, target);
  };
  // `micro` micro-batches, carried on from k1 and k2 blocks per stage to all of them.
  auto in_blocks = [&](int micro) {
    const PlanFigures a = at(k1, micro);
    return k2 == k1 ? a
                    : extrapolate(a, at(k2, micro), static_cast<double>(k1),
                                  static_cast<double>(k2), static_cast<double>(blocks));
  };
  // The fewest micro-batches: the least each stage can hold. Over `stop_above` already: done.
  const PlanFigures one = in_blocks(m1);
  if (m == m1 || one.peak_bytes > stop_above)
    return one;
  const PlanFigures two = in_blocks(m2);

  // The step: each further micro-batch costs what those from m1 to m2 did (a full pipeline's
  // steady state adds its slowest stage's forward and backward per micro-batch).
  PlanFigures f = extrapolate(one, two, m1, m2, m);
  // Memory: a stage holds the activations of the micro-batches it has forwarded and not yet
  // backwarded, at most `held[s]` of them under the schedule; each costs what those from m1 to
  // m2 did. The batch itself (token ids and targets, int64) grows with every micro-batch.
  const int64_t batch_bytes = 2 * 8 * micro_batch_size_of(config) * config.shape.seq_len;
  const std::vector<int> held = held_at_once(config, m), held_one = held_at_once(config, m1),
                         held_two = held_at_once(config, m2);
  const std::vector<StageFigures> s1 = per_stage(one.stages), s2 = per_stage(two.stages);
  f.stages = s1;
  for (size_t i = 0; i < s1.size(); ++i) {
    const auto stage = static_cast<size_t>(s1[i].stage);
    const int extra_two = held_two[stage] - held_one[stage], extra = held[stage] - held_one[stage];
    auto carry = [&](int64_t a, int64_t b, bool batch) {
      const int64_t measured_batch = batch ? batch_bytes * (m2 - m1) : 0;
      const int64_t per_held = extra_two > 0 ? (b - a - measured_batch) / extra_two : 0;
      return a + per_held * extra + (batch ? batch_bytes * (m - m1) : 0);
    };
    const size_t activations = static_cast<size_t>(MemoryCategory::Activations);
    StageFigures& out = f.stages[i];
    out.peak_bytes = carry(s1[i].peak_bytes, s2[i].peak_bytes, true);
    for (size_t c = 0; c < out.peak_by_category.size(); ++c)
      out.peak_by_category[c] =
          carry(s1[i].peak_by_category[c], s2[i].peak_by_category[c], c == activations);
  }
  f.tokens_per_step =
      config.batch_size * (config.gpus / (config.tp * config.pp * config.cp)) * config.shape.seq_len;
  derive_rates(f);
  return f;
}

int64_t model_state_floor(const TrainConfig& c) {
  const int64_t psi = preset_parameter_count(c.model, c.shape);
  // What ZeRO shards over: dp_shard × cp (HSDP), or all of dp × cp.
  const int dp = c.dp_shard > 0 ? c.dp_shard * c.cp : c.gpus / (c.tp * c.pp);
  const double element = c.precision == "fp32" ? 4 : 2;
  // The optimizer's fp32 state per parameter: Adam's two moments or SGD's momentum buffer,
  // and the fp32 master weights of mixed precision.
  const double state = (c.optimizer.name == "adam" ? 8 : c.optimizer.momentum != 0 ? 4 : 0) +
                       (c.precision == "fp32" ? 0 : 4);
  const double per_parameter = element / (c.zero >= 3 ? dp : 1) +
                               element / (c.zero >= 2 ? dp : 1) +
                               state / (c.zero >= 1 ? dp : 1);
  return static_cast<int64_t>(static_cast<double>(psi) / (c.tp * c.pp) * per_parameter);
}

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
          most_figures = estimate(most);
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

} // namespace

SearchResult search_layouts(const TrainConfig& base, const ClusterSpec& cluster,
                            const SearchOptions& options) {
  if (base.global_batch_size <= 0)
    throw std::invalid_argument("meshsim plan --search needs --global-batch-size (the batch every "
                                "layout must train on)");
  const auto memory = static_cast<int64_t>(cluster.gpu.mem_bytes);
  const std::vector<FamilyShape> shapes = family_shapes(base, cluster);
  const int workers = options.workers > 0
                          ? options.workers
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<FamilyOutcome> outcomes =
      search_families(base, cluster, shapes, memory, options, workers);

  SearchResult result;
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
