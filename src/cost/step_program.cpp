// build_step_program: one recorded step of every rank as a replay Program (see predict.h for
// the rules; this file is their implementation).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "base/for_each_at_once.h"
#include "cost/predict.h"

namespace meshsim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string join(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks)
    text += (text.empty() ? "" : ",") + std::to_string(r);
  return text;
}

// The same string on every member's instance of one collective: op, group and the recorded
// sequence number; send/recv by their order per directed pair, as NCCL matches them (the
// recorded seq counts per tag, and the tag is not recorded). keys[r][i] is that of
// ranks[r].collectives[i].
std::vector<std::vector<std::string>> collective_keys(const std::vector<Recorder>& ranks) {
  std::vector<std::vector<std::string>> keys(ranks.size());
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    std::map<std::pair<int, int>, int64_t> p2p; // (src, dst) -> calls so far
    keys[static_cast<size_t>(r)].reserve(ranks[static_cast<size_t>(r)].collectives.size());
    for (const CollectiveRecord& c : ranks[static_cast<size_t>(r)].collectives) {
      if (c.op == "send" || c.op == "recv") {
        const std::pair<int, int> pair =
            c.op == "send" ? std::make_pair(r, c.peer) : std::make_pair(c.peer, r);
        keys[static_cast<size_t>(r)].push_back(
            "p2p " + std::to_string(pair.first) + ">" + std::to_string(pair.second) + "#" +
            std::to_string(p2p[pair]++));
      } else {
        keys[static_cast<size_t>(r)].push_back(c.op + "{" + join(c.group) + "}#" +
                                               std::to_string(c.seq));
      }
    }
  }
  return keys;
}

// The rank whose timeline decides which step a collective belongs to.
int owner_of(const CollectiveRecord& c, int rank) {
  if (c.op == "send")
    return rank;
  if (c.op == "recv")
    return c.peer;
  return c.group.empty() ? rank : *std::min_element(c.group.begin(), c.group.end());
}

// owner_of, except that a message from a rank with no records (an image, in a plan) is its
// receiver's: a ring's previous member is such an image when one member of the ring runs.
int owner_for_step(const std::vector<Recorder>& ranks, const CollectiveRecord& c, int rank,
                   const PredictOptions& o) {
  const int owner = owner_of(c, rank);
  if (o.images && owner != rank && owner >= 0 && owner < static_cast<int>(ranks.size()) &&
      ranks[static_cast<size_t>(owner)].compute.empty())
    return rank;
  return owner;
}

struct Window {
  double begin = kInf;
  double end = kInf;
};

Window window_of(const Recorder& r, int64_t step) {
  Window w;
  for (const ComputeRecord& c : r.compute)
    if (c.step == step)
      w.begin = std::min(w.begin, c.start_s);
  for (const ComputeRecord& c : r.compute)
    if (c.step > step && c.start_s >= w.begin)
      w.end = std::min(w.end, c.start_s);
  return w;
}

} // namespace

// Whether a layer's linear GEMMs run in FP8 under PredictOptions::fp8: a transformer block's
// ("block<N>"), as Transformer Engine's layers are the blocks' (the embedding and the head stay
// in bf16, as in Megatron-LM and torchao's default).
bool runs_in_fp8(const LayerWork& w) {
  return w.layer.rfind("block", 0) == 0 && w.gemm_flops > 0;
}

// One layer's pass on the target: its GEMMs by size and the rest memory bound, at least its
// launches (roofline.h); a layer from older records, with no kernel counts, as one roofline.
double layer_time(const LayerWork& w, const GpuSpec& gpu, const PredictOptions& o) {
  const OpClass op = parse_op_class(w.op);
  if (w.kernels == 0 && w.gemms == 0)
    return roofline({w.flops, w.bytes, op, o.dtype}, gpu, o.efficiency).time_s;
  KernelMix mix;
  mix.gemm_flops = w.gemm_flops;
  mix.gemm_bytes = w.gemm_bytes;
  mix.gemms = w.gemms;
  mix.other_flops = std::max(0.0, w.flops - w.gemm_flops);
  // The eager attention core's scores through memory (a fused core records none).
  mix.other_bytes = std::max(0.0, w.bytes - w.gemm_bytes) + w.score_bytes;
  // What is not a GEMM in a matmul-class layer (a transformer block's norms, activations and
  // residual adds) is elementwise work.
  mix.other = op == OpClass::Matmul || op == OpClass::Attention ? OpClass::Elementwise : op;
  mix.kernels = w.kernels;
  mix.dtype = o.dtype;
  if (!o.fp8 || !runs_in_fp8(w) || mix.gemms == 0)
    return kernel_mix_time(mix, gpu, o.efficiency);
  // FP8: the linear GEMMs (all but the attention core's) read one-byte operands, and each of
  // them first quantizes its operands: reads them at `dtype`, writes them in one byte, twice
  // (Hopper's FP8 GEMMs take only one layout, so the transposed copy the backward needs is
  // written too), counted as their bf16 traffic once more, one kernel each.
  const double core = std::clamp(w.attention_flops, 0.0, mix.gemm_flops);
  if (core >= mix.gemm_flops) // only the attention core: no linear GEMM runs in FP8
    return kernel_mix_time(mix, gpu, o.efficiency);
  const double share = (mix.gemm_flops - core) / mix.gemm_flops;
  KernelMix fp8;
  fp8.dtype = Dtype::FP8;
  fp8.gemm_flops = mix.gemm_flops - core;
  fp8.gemms = std::max<int64_t>(1, std::llround(share * static_cast<double>(mix.gemms)));
  fp8.gemm_bytes = share * mix.gemm_bytes * dtype_bytes(Dtype::FP8) / dtype_bytes(o.dtype);
  fp8.other_bytes = share * mix.gemm_bytes;
  fp8.other = OpClass::Elementwise;
  mix.gemm_flops = core;
  mix.gemm_bytes *= 1 - share;
  mix.gemms = std::max<int64_t>(0, mix.gemms - fp8.gemms);
  mix.kernels += fp8.gemms; // the quantizing kernels
  return kernel_mix_time(fp8, gpu, o.efficiency) + kernel_mix_time(mix, gpu, o.efficiency);
}

namespace {

// Time of a region on the target, and the cumulative fraction after each of its layers.
double region_time(const ComputeRecord& c, const GpuSpec& gpu, const PredictOptions& o,
                   std::vector<double>* cumulative) {
  const double measured = std::max(0.0, c.end_s - c.start_s);
  if (o.measured_compute || c.layers.empty()) {
    if (cumulative)
      for (size_t i = 0; i < c.layers.size(); ++i)
        cumulative->push_back(static_cast<double>(i + 1) / static_cast<double>(c.layers.size()));
    return measured;
  }
  std::vector<double> times;
  double total = 0;
  for (const LayerWork& w : c.layers) {
    times.push_back(layer_time(w, gpu, o));
    total += times.back();
  }
  if (cumulative) {
    double acc = 0;
    for (double t : times)
      cumulative->push_back(total > 0 ? (acc += t) / total : 1.0);
  }
  return total;
}

// Where a collective sits in its rank's program: where the rank called it, or for one started
// with *_async, where the rank waited for it.
double place_s(const CollectiveRecord& c) {
  return c.waited_s >= 0 ? c.waited_s : c.start_s;
}

// Whether `c` and the collectives `inside` it carry their rank's memory charges
// (ComputeRecord::start_charges; absent in records.json written before them).
bool has_charges(const ComputeRecord& c, const std::vector<const CollectiveRecord*>& inside) {
  bool counted = c.start_charges >= 0 && c.end_charges >= c.start_charges;
  for (const auto* x : inside)
    counted = counted && x->start_charges >= 0 && x->end_charges >= x->start_charges;
  return counted;
}

// The size of each piece of `c` between the collectives `inside` it: by the memory charges
// its rank made in each (a count of the operations that ran, the same in every run, where a
// plan's clock measures only how fast the host dispatched them), or by the measured time.
std::vector<double> pieces(const ComputeRecord& c,
                           const std::vector<const CollectiveRecord*>& inside, bool by_charges) {
  const auto at = [by_charges](double s, int64_t charges) {
    return by_charges ? static_cast<double>(charges) : s;
  };
  std::vector<double> out;
  double prev = at(c.start_s, c.start_charges);
  // A collective started with *_async splits the region where the rank waited for it.
  for (const auto* x : inside)
    out.push_back(std::max(0.0, at(place_s(*x), x->start_charges) - prev)),
        prev = at(x->waited_s >= 0 ? x->waited_s : x->end_s, x->end_charges);
  out.push_back(std::max(0.0, at(c.end_s, c.end_charges) - prev));
  return out;
}

bool is_gradient_reduction(const std::string& op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "reduce";
}

// DDP's (and ZeRO's) buckets: the reductions right after region `c` (from `colls[ci]` on,
// before `next_start`) that add up to its layers' parameters (`width` times their bytes:
// 2 for 16-bit gradients reduced in fp32), each with the share of the region (`cumulative`,
// after each layer) at which its gradients are ready. Empty when they do not add up, or
// without PredictOptions::overlap_buckets.
std::vector<std::pair<const CollectiveRecord*, double>>
gradient_buckets_of_width(const ComputeRecord& c, const std::vector<double>& cumulative,
                          const std::vector<const CollectiveRecord*>& colls, size_t ci,
                          double next_start, const PredictOptions& o, double width) {
  std::vector<double> param_cum;
  double acc = 0;
  for (const LayerWork& w : c.layers)
    param_cum.push_back(acc += width * static_cast<double>(w.param_bytes));
  std::vector<std::pair<const CollectiveRecord*, double>> buckets; // record, ready fraction
  // ZeRO pads each flat buffer to a multiple of its group: up to group - 1 elements of at
  // most 4 bytes a bucket beyond the parameters' own bytes.
  double matched = 0, padding = 0;
  for (size_t j = ci; o.overlap_buckets && acc > 0 && j < colls.size() &&
                      place_s(*colls[j]) < next_start && is_gradient_reduction(colls[j]->op);
       ++j) {
    matched += static_cast<double>(colls[j]->bytes);
    padding += 4.0 * static_cast<double>(colls[j]->group.size());
    if (matched > acc + padding)
      break;
    const size_t layer = std::lower_bound(param_cum.begin(), param_cum.end(),
                                          std::min(matched, acc)) -
                         param_cum.begin();
    buckets.emplace_back(colls[j], cumulative[std::min(layer, cumulative.size() - 1)]);
    if (matched >= acc)
      break;
  }
  if (matched < acc || matched > acc + padding)
    buckets.clear();
  return buckets;
}

// The buckets at the parameters' width, or else at twice it (ZeRO 1's fp32 flat gradient of
// 16-bit parameters, --reduce-fp32: parallel/data/zero.h).
std::vector<std::pair<const CollectiveRecord*, double>>
gradient_buckets(const ComputeRecord& c, const std::vector<double>& cumulative,
                 const std::vector<const CollectiveRecord*>& colls, size_t ci, double next_start,
                 const PredictOptions& o) {
  auto buckets = gradient_buckets_of_width(c, cumulative, colls, ci, next_start, o, 1);
  if (buckets.empty() && o.dtype != Dtype::FP32)
    buckets = gradient_buckets_of_width(c, cumulative, colls, ci, next_start, o, 2);
  return buckets;
}

// Appends one rank's tasks, each depending on the last blocking one unless told otherwise.
// Tasks are named by their index in the rank's list (their ids are strings, built once).
class RankBuilder {
public:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  static constexpr size_t kNothing = kNone - 1; // `after` for a task that waits for none

  RankBuilder(int rank, std::vector<Task>& out) : rank_(rank), out_(out) {}

  size_t compute(const std::string& name, double seconds) {
    std::vector<std::string> d = deps(last_);
    for (size_t id : due_) d.push_back(out_[id].id);
    due_ = std::move(deferred_);
    deferred_.clear();
    out_.push_back(Task::compute(next_id(name), seconds, std::move(d)));
    return last_ = out_.size() - 1;
  }

  // `after`: the task it waits for (kNone: the last blocking task; kNothing: none). Returns
  // its index.
  // `overlapped`: the compute that follows runs beside it, and the compute after that waits
  // for it (tensor parallelism's communication overlapped with its GEMMs).
  size_t comm(const CollectiveRecord& c, const std::string& key, size_t after = kNone,
              bool overlapped = false, int stream = 0) {
    const int n = static_cast<int>(c.group.size());
    double bytes = static_cast<double>(c.bytes);
    if (c.op == "all_gather")
      bytes *= n; // collective_cost.h: all_gather counts its output
    if (c.op == "barrier")
      bytes = 0;
    std::vector<int> group = c.group;
    if (c.op == "send")
      group = {rank_, c.peer};
    if (c.op == "recv")
      group = {c.peer, rank_};
    out_.push_back(Task::comm(next_id(c.op), parse_collective_op(c.op), std::move(group), bytes,
                              deps(after == kNone      ? last_
                                   : after == kNothing ? kNone
                                                       : after),
                              key));
    for (int64_t b : c.peer_bytes) // all_to_all: each member's share
      out_.back().peer_bytes.push_back(static_cast<double>(b));
    out_.back().stream = stream;
    const size_t id = out_.size() - 1;
    if (overlapped)
      deferred_.push_back(id);
    else if (c.op != "send")
      last_ = id; // a send is buffered: nothing waits for it
    return id;
  }
  size_t last() const { return last_; }

private:
  std::vector<std::string> deps(size_t task) const {
    if (task == kNone)
      return {};
    return {out_[task].id};
  }
  std::string next_id(const std::string& name) {
    return "r" + std::to_string(rank_) + "/" + std::to_string(count_++) + ":" + name;
  }

  int rank_;
  std::vector<Task>& out_;
  size_t last_ = kNone;
  std::vector<size_t> deferred_; // overlapped collectives the compute after next waits for
  std::vector<size_t> due_;      // those the next compute waits for
  int count_ = 0;
};

// Whether a collective inside a compute region runs beside the compute that follows it:
// tensor parallelism's all-gathers, reduce-scatters and all-reduces (a group of tp ranks)
// under PredictOptions::overlap_tensor_parallel.
bool overlaps_compute(const CollectiveRecord& c, const PredictOptions& o) {
  return o.overlap_tensor_parallel && o.tp > 1 && static_cast<int>(c.group.size()) == o.tp &&
         (c.op == "all_gather" || c.op == "reduce_scatter" || c.op == "all_reduce");
}

} // namespace

int64_t representative_step(const std::vector<Recorder>& ranks) {
  std::set<int64_t> steps;
  for (const Recorder& r : ranks)
    for (const ComputeRecord& c : r.compute)
      if (c.step > 0)
        steps.insert(c.step);
  if (steps.empty())
    return 0;
  if (steps.size() == 1)
    return *steps.begin();
  return *std::prev(steps.end(), 2);
}

Program build_step_program(const std::vector<Recorder>& ranks, int64_t step, const GpuSpec& gpu,
                           const PredictOptions& o, double* flops, double* recompute_flops) {
  const int n = static_cast<int>(ranks.size());
  std::vector<Window> windows;
  bool any = false;
  for (const Recorder& r : ranks) {
    windows.push_back(window_of(r, step));
    any = any || windows.back().begin < kInf;
  }
  if (!any)
    throw std::invalid_argument("predict: step " + std::to_string(step) + " was not recorded");

  // Which collectives belong to the step: decided on their owner's timeline.
  const auto keys = collective_keys(ranks);
  std::unordered_set<std::string> included;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < ranks[r].collectives.size(); ++i) {
      const CollectiveRecord& c = ranks[r].collectives[i];
      if (owner_for_step(ranks, c, r, o) == r && place_s(c) >= windows[r].begin &&
          place_s(c) < windows[r].end)
        included.insert(keys[r][i]);
    }

  Program program;
  program.ranks.resize(static_cast<size_t>(n));
  // Each rank's program is its own: built on every core at once.
  const auto build_rank = [&](size_t index) {
    const int r = static_cast<int>(index);
    std::vector<const ComputeRecord*> regions;
    for (const ComputeRecord& c : ranks[r].compute)
      if (c.step == step)
        regions.push_back(&c);
    std::vector<const CollectiveRecord*> colls;
    for (size_t i = 0; i < ranks[r].collectives.size(); ++i)
      if (included.count(keys[r][i]))
        colls.push_back(&ranks[r].collectives[i]);
    // The key of one of this rank's records.
    const auto key = [&](const CollectiveRecord* c) -> const std::string& {
      return keys[r][static_cast<size_t>(c - ranks[r].collectives.data())];
    };
    auto by_start = [](const auto* a, const auto* b) { return a->start_s < b->start_s; };
    std::stable_sort(regions.begin(), regions.end(), by_start);
    // A collective started with *_async takes its place in the rank's program where the
    // rank waited for it: DDP's buckets, launched during backward and waited for after it,
    // are then the reductions that follow backward, which the replay overlaps with it below.
    std::stable_sort(colls.begin(), colls.end(), [](const auto* a, const auto* b) {
      return place_s(*a) < place_s(*b);
    });

    RankBuilder b(r, program.ranks[r]);
    // The rank's compute tasks so far, each with where it ends on the recorded clock: an
    // all-gather started ahead of its wait runs after the last that ended before its start.
    std::vector<std::pair<double, size_t>> history;
    size_t ci = 0;
    for (size_t k = 0; k < regions.size(); ++k) {
      const ComputeRecord& c = *regions[k];
      while (ci < colls.size() && place_s(*colls[ci]) <= c.start_s)
        b.comm(*colls[ci], key(colls[ci])), ++ci;
      std::vector<const CollectiveRecord*> inside;
      while (ci < colls.size() && place_s(*colls[ci]) < c.end_s)
        inside.push_back(colls[ci++]);
      std::vector<double> cumulative;
      const double target = region_time(c, gpu, o, &cumulative);
      const double next_start = k + 1 < regions.size() ? regions[k + 1]->start_s : kInf;

      if (!inside.empty()) { // split at each blocking collective
        // Measured: the pieces themselves (the region's span includes the collectives).
        const bool measured = o.measured_compute || c.layers.empty();
        const std::vector<double> segments =
            pieces(c, inside, !measured && has_charges(c, inside));
        double sum = 0;
        for (double s : segments)
          sum += s;
        // The tasks of this region so far, each with where it ends in the rank's program.
        std::vector<std::pair<double, size_t>> placed{{c.start_s, b.last()}};
        std::vector<std::pair<double, size_t>> pieces_done; // share of the region done, piece
        double done_share = 0;
        for (size_t i = 0; i < segments.size(); ++i) {
          const double share =
              sum > 0 ? segments[i] / sum : 1.0 / static_cast<double>(segments.size());
          const size_t piece = b.compute(c.name, measured ? segments[i] : target * share);
          done_share += share;
          pieces_done.emplace_back(done_share, piece);
          if (i == inside.size()) {
            history.emplace_back(c.end_s, piece);
            break;
          }
          const CollectiveRecord& x = *inside[i];
          placed.emplace_back(place_s(x), piece);
          history.emplace_back(place_s(x), piece);
          // An all-gather or reduce-scatter started ahead of its wait (the distributed
          // optimizer's gathers started by zero_grad, ZeRO 3's prefetched gathers, ZeRO 2's and
          // 3's reduce-scatters: parallel/data/zero.h) runs on the data-parallel stream from
          // where it was started, beside the compute up to its wait; what follows its wait
          // waits for it.
          if (x.waited_s >= 0 && (x.op == "all_gather" || x.op == "reduce_scatter")) {
            size_t started_after = RankBuilder::kNothing; // started before the step's tasks
            for (const auto& [at, id] : history)
              if (at <= x.start_s) started_after = id;
            placed.emplace_back(place_s(x), b.comm(x, key(inside[i]), started_after, false, 1));
            continue;
          }
          // A message started with isend/irecv (the ring of context parallelism) runs from
          // where it was started, beside the compute up to its wait: it waits for the task
          // that ended last before its start, and what follows its wait waits for it, so only
          // the part of it longer than that compute is exposed.
          size_t issued_after = RankBuilder::kNone;
          if (x.waited_s >= 0 && (x.op == "send" || x.op == "recv"))
            for (const auto& [at, id] : placed)
              if (at <= x.start_s) issued_after = id;
          const bool overlapped = overlaps_compute(x, o);
          if (overlapped)
            issued_after = piece;
          const size_t id = b.comm(x, key(inside[i]), issued_after, overlapped);
          placed.emplace_back(place_s(x), id);
        }
        // Gradient buckets after a region split by collectives (a backward under tensor
        // parallelism): each starts once the piece holding its last layer has ended.
        if (!measured) {
          const auto buckets = gradient_buckets(c, cumulative, colls, ci, next_start, o);
          for (const auto& [rec, fraction] : buckets) {
            // The first piece that ends at or after the bucket's last layer (the last piece
            // where rounding leaves none).
            auto ready =
                std::find_if(pieces_done.begin(), pieces_done.end(),
                             [f = fraction](const auto& p) { return p.first >= f - 1e-12; });
            if (ready == pieces_done.end())
              --ready;
            b.comm(*rec, key(rec), ready->second, false, 1);
          }
          ci += buckets.size();
        }
        continue;
      }

      const auto buckets = gradient_buckets(c, cumulative, colls, ci, next_start, o);
      if (buckets.empty()) {
        history.emplace_back(c.end_s, b.compute(c.name, target));
        continue;
      }
      std::vector<size_t> ready_piece;
      double done = 0;
      size_t piece = RankBuilder::kNone;
      for (const auto& [rec, fraction] : buckets) {
        if (fraction > done || piece == RankBuilder::kNone)
          piece = b.compute(c.name, target * (fraction - done)), done = fraction;
        ready_piece.push_back(piece);
      }
      if (done < 1)
        piece = b.compute(c.name, target * (1 - done));
      history.emplace_back(c.end_s, piece);
      for (size_t i = 0; i < buckets.size(); ++i)
        b.comm(*buckets[i].first, key(buckets[i].first), ready_piece[i]);
      ci += buckets.size();
    }
    for (; ci < colls.size(); ++ci)
      b.comm(*colls[ci], key(colls[ci]));
  };
  for_each_at_once(static_cast<size_t>(n),
                   static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                   build_rank);
  double total_flops = 0, total_recompute = 0;
  for (const Recorder& rank : ranks)
    for (const ComputeRecord& c : rank.compute)
      if (c.step == step)
        total_flops += c.flops, total_recompute += c.recompute_flops;
  if (flops)
    *flops = total_flops;
  if (recompute_flops)
    *recompute_flops = total_recompute;
  return program;
}

} // namespace meshsim
