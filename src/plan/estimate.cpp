// estimate_layout and model_state_floor. See estimate.h.
#include "plan/estimate.h"

#include <algorithm>
#include <cmath>

#include "config/config.h"
#include "memory/category.h"
#include "models/family.h"
#include "models/llama.h"
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
// taken. Within one window the moment of the peak can change too: a backward peaks at its
// start, with every block's activations, once there are enough blocks, but in a small plan at
// its end, where a constant transient (the embedding's gradient) outweighs them; a line
// through two such small plans follows the end and misses the start. So a window's peak is
// at least its activations' peak plus the model state (held all along), each carried on.
PlanFigures extrapolate(const PlanFigures& a, const PlanFigures& b, double ta, double tb, double t) {
  PlanFigures f = a;
  std::vector<StageFigures> sa = a.stages, sb = b.stages;
  if (sa.size() != sb.size()) // tp ranks alike at one size and not the other
    sa = per_stage(sa), sb = per_stage(sb);
  f.stages = sa;
  const auto activations = static_cast<size_t>(MemoryCategory::Activations);
  for (size_t i = 0; i < sa.size(); ++i) {
    StageFigures& s = f.stages[i];
    s.model_state_bytes = line_bytes(sa[i].model_state_bytes, sb[i].model_state_bytes, ta, tb, t);
    // A peak carried on, but no less than the activations' with the model state beside them.
    auto at_least_state = [&](int64_t peak, const CategoryBytes& x, const CategoryBytes& y) {
      return std::max(peak, line_bytes(x[activations], y[activations], ta, tb, t) +
                                s.model_state_bytes);
    };
    const auto& wa = sa[i].windows;
    const auto& wb = sb[i].windows;
    const bool windows = !wa.empty() && wa.size() == wb.size() &&
                         std::equal(wa.begin(), wa.end(), wb.begin(), [](const auto& x, const auto& y) {
                           return x.phase == y.phase;
                         });
    if (!windows) {
      s.windows.clear();
      s.peak_bytes = at_least_state(line_bytes(sa[i].peak_bytes, sb[i].peak_bytes, ta, tb, t),
                                    sa[i].peak_by_category, sb[i].peak_by_category);
      for (size_t c = 0; c < s.peak_by_category.size(); ++c)
        s.peak_by_category[c] =
            line_bytes(sa[i].peak_by_category[c], sb[i].peak_by_category[c], ta, tb, t);
      continue;
    }
    s.peak_bytes = 0;
    s.peak_by_category.fill(0);
    for (size_t w = 0; w < wa.size(); ++w) {
      PeakWindow& out = s.windows[w];
      out.stats.peak = at_least_state(line_bytes(wa[w].stats.peak, wb[w].stats.peak, ta, tb, t),
                                      wa[w].stats.peak_by_category, wb[w].stats.peak_by_category);
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

// Per stage: the most micro-batches it holds at once with `micro_batches` under the
// configuration's schedule (one without a pipeline).
std::vector<int> held_at_once(const TrainConfig& config, int micro_batches) {
  if (config.pp == 1)
    return {1};
  return dry_run(make_schedule(config.schedule, config.pp, micro_batches, config.virtual_stages))
      .peak_in_flight;
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
  // A mixture of experts' routed experts: over ep (and pp; tp does not split them), their
  // state sharded over edp = dp × cp / ep; the rest over tp and pp, sharded over dp × cp.
  const int64_t experts =
      c.shape.moe.experts > 0 && model_family(c.model).transformer
          ? (c.shape.layers - c.shape.moe.dense_layers) * 3 * c.shape.moe.experts *
                c.shape.hidden * llama_moe_options(c.shape).expert_ffn
          : 0;
  const int64_t psi = preset_parameter_count(c.model, c.shape) - experts;
  // What ZeRO shards over: dp_shard × cp (HSDP), or all of dp × cp.
  const int dp = c.dp_shard > 0 ? c.dp_shard * c.cp : c.gpus / (c.tp * c.pp);
  const double element = c.precision == "fp32" ? 4 : 2;
  // The optimizer's fp32 state per parameter: Adam's two moments or SGD's momentum buffer,
  // and the fp32 master weights of mixed precision.
  const double state = (c.optimizer.name == "adam" ? 8 : c.optimizer.momentum != 0 ? 4 : 0) +
                       (c.precision == "fp32" ? 0 : 4);
  auto per_parameter = [&](double shards) {
    return element / (c.zero >= 3 ? shards : 1) + element / (c.zero >= 2 ? shards : 1) +
           state / (c.zero >= 1 ? shards : 1);
  };
  const double edp = static_cast<double>(c.gpus / (c.tp * c.pp)) / c.ep;
  return static_cast<int64_t>(static_cast<double>(psi) / (c.tp * c.pp) * per_parameter(dp) +
                              static_cast<double>(experts) / (c.ep * c.pp) * per_parameter(edp));
}

} // namespace meshsim
