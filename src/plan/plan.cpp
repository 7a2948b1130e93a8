// make_plan: the configuration's strategy, stepped on meta tensors. See plan.h.
#include "plan/plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "cost/hardware.h"
#include "memory/allocator.h"
#include "memory/category.h"
#include "memory/virtual_gpu.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"
#include "models/family.h"
#include "parallel/strategy.h"
#include "config/stage_layers.h"
#include "config/strategy_options.h"
#include "plan/stage_images.h"

namespace meshsim {
namespace {

// The ranks that differ: one per pipeline stage, data-parallel index 0 and tensor-parallel
// index 0 (every stage runs: the first holds the embedding, the last the head, and stages of
// unequal size, --stage-layers, differ in their blocks too). The other members of a tp group hold shards of equal size (heads and the MLP split
// evenly) and the same replicated layers, and the other replicas are copies: all are images.
// Middle stages that are images of stage 1 (stage_images.h) are not run.
std::vector<int> executed_ranks(const ParallelDims& dims, const StageImages& images) {
  std::vector<int> ranks;
  for (int s = 0; s < dims.pp; ++s)
    if (!images.holds(s))
      ranks.push_back(dims.rank({0, 0, s}));
  return ranks;
}

// A replica's batch as the data loader hands it over (the family's example_batch), charged
// as activations.
Batch meta_batch(const TrainConfig& config) {
  CategoryScope scope(MemoryCategory::Activations);
  const auto options = torch::TensorOptions().dtype(torch::kLong).device(torch::kMeta);
  Batch b;
  std::tie(b.inputs, b.targets) =
      example_batch(model_family(config.model), config.batch_size, config.shape, options);
  return b;
}

} // namespace

std::vector<Recorder> replicate_replicas(const std::vector<Recorder>& executed,
                                         const ParallelDims& dims) {
  std::vector<Recorder> out(static_cast<size_t>(dims.world));
  for (int d = 0; d < dims.dp; ++d) {
    for (int cp = 0; cp < dims.cp; ++cp) {
      for (int t = 0; t < dims.tp; ++t) {
        // A member's image in replica d at cp index cp and tp index t: the coordinates its
        // group spans are kept (a dp group stays the dp group, a tp group the tp group), the
        // others become (d, cp, t); a message's peer in the cp ring moves round with it. dp
        // is two coordinates with HSDP, each kept or replaced alone: a shard group spans
        // dp_shard only, a replicate group dp_replicate only.
        const int shards = dims.dp_shard;
        auto rename = [&](const std::vector<int>& group, int rank, bool peer) {
          bool spans_replica = false, spans_shard = false, spans_tp = false, spans_cp = false;
          const ParallelCoord first = dims.coord(group.front());
          for (int g : group) {
            const ParallelCoord c = dims.coord(g);
            spans_replica = spans_replica || c.dp / shards != first.dp / shards;
            spans_shard = spans_shard || c.dp % shards != first.dp % shards;
            spans_tp = spans_tp || c.tp != first.tp;
            spans_cp = spans_cp || c.cp != first.cp;
          }
          ParallelCoord c = dims.coord(rank);
          const int replica = spans_replica ? c.dp / shards : d / shards;
          const int shard = spans_shard ? c.dp % shards : d % shards;
          c.dp = replica * shards + shard;
          if (!spans_tp)
            c.tp = t;
          if (peer)
            c.cp = (c.cp + cp) % dims.cp;
          else if (!spans_cp)
            c.cp = cp;
          return dims.rank(c);
        };
        for (int s = 0; s < dims.pp; ++s) {
          const int original = dims.rank({0, 0, s});
          Recorder copy = executed[static_cast<size_t>(original)];
          for (CollectiveRecord& c : copy.collectives) {
            const std::vector<int> group = c.group;
            const bool p2p = c.peer >= 0;
            if (p2p)
              c.peer = rename({c.peer}, c.peer, true);
            for (int& g : c.group)
              g = rename(p2p ? std::vector<int>{g} : group, g, p2p);
          }
          ParallelCoord image{d, t, s};
          image.cp = cp;
          out[static_cast<size_t>(dims.rank(image))] = std::move(copy);
        }
      }
    }
  }
  return out;
}

void check_plannable(const TrainConfig& config) {
  if (!model_family(config.model).builds_on_meta)
    throw std::invalid_argument(fmt::format(
        "meshsim plan runs gpt, llama and resnet50, whose layers are built on the meta device; "
        "{} is built on the host: train it instead",
        config.model));
  if (config.strategy != "ddp")
    throw std::invalid_argument(fmt::format(
        "meshsim plan runs --strategy ddp and its layouts (--tp --pp --zero), not {}",
        config.strategy));
}

void check_plan_work(const TrainConfig& config, int64_t steps) {
  if (!model_family(config.model).transformer)
    return; // an image model's layers are fixed
  const double layers = static_cast<double>(config.shape.layers);
  double per_stage = std::ceil(layers / (config.pp * config.virtual_stages)) * config.virtual_stages;
  const std::vector<int64_t> stages = stage_layer_counts(config);  // unequal stages: the largest
  if (!stages.empty()) {
    std::vector<double> on_rank(static_cast<size_t>(config.pp), 0.0);
    for (size_t c = 0; c < stages.size(); ++c)
      on_rank[c % on_rank.size()] += static_cast<double>(stages[c]);
    per_stage = *std::max_element(on_rank.begin(), on_rank.end());
  }
  if (per_stage > kMaxPlannedBlocksPerStage)
    throw std::invalid_argument(fmt::format(
        "--layers {} puts {:.0f} transformer blocks on each of --pp {} stages; a plan builds at "
        "most {} per stage (the largest published models have under 130 in all)",
        config.shape.layers, per_stage, config.pp, kMaxPlannedBlocksPerStage));
  // One GPU per stage runs (plan.h): together they pass every block once per micro-batch.
  const double passes = layers * static_cast<double>(config.micro_batches) * static_cast<double>(steps);
  if (passes > static_cast<double>(kMaxPlannedBlockPasses))
    throw std::invalid_argument(fmt::format(
        "a plan of --layers {} with {} micro-batches runs {:.3g} block passes, more than the {} "
        "it will try; plan fewer micro-batches (--micro-batch-size, --global-batch-size) or layers",
        config.shape.layers, config.micro_batches, passes, kMaxPlannedBlockPasses));
}

Plan make_plan(const TrainConfig& config, int64_t capacity_bytes, int64_t steps,
               const PlanRunOptions& run) {
  check_plannable(config);
  check_plan_work(config, steps);
  Plan plan;
  plan.dims = layout_dims(config);
  plan.steps = steps;
  plan.samples_per_step = config.batch_size * plan.dims.dp;
  // An image is one sample and no tokens; a plan's rates count it as one "token".
  plan.tokens_per_step =
      plan.samples_per_step * tokens_per_sample(model_family(config.model), config.shape);

  MeshOptions mesh_options;
  mesh_options.world_size = config.gpus;
  mesh_options.capacity_bytes = capacity_bytes;
  mesh_options.device = "meta";
  mesh_options.comm_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout_s * 1000));
  mesh_options.peak_windows = true;
  const StageImages images =
      run.stage_images ? stage_images(config, plan.dims) : StageImages{};
  // Each stage's first rank, or the one it is an image of: the GPUs the plan reports, and the
  // only ones its memory samples read.
  std::vector<int> sampled;
  for (int s = 0; s < plan.dims.pp; ++s)
    sampled.push_back(images.holds(s) ? plan.dims.rank({0, 0, 1}) : plan.dims.rank({0, 0, s}));
  mesh_options.timeline = run.timeline;
  mesh_options.timeline_gpus = sampled;
  mesh_options.p2p_route = stage_image_route(plan.dims, images);
  DeviceMesh mesh(mesh_options);

  StrategyOptions options = strategy_options(config);
  options.device = torch::kMeta;
  if (run.node_size > 0)
    options.node_size = run.node_size;
  const std::vector<int> ranks = executed_ranks(plan.dims, images);
  std::vector<int64_t> state(static_cast<size_t>(config.gpus), 0);
  std::vector<Recorder> recorders = run_ranks(
      mesh,
      [&](RankContext& ctx) {
        auto strategy = make_strategy(config.strategy, ctx, options);
        for (int64_t step = 1; step <= plan.steps; ++step) {
          strategy->step(meta_batch(config), step);
          state[static_cast<size_t>(ctx.rank)] =
              std::max(state[static_cast<size_t>(ctx.rank)], model_state_bytes(ctx.gpu));
        }
        ctx.mesh.close_window(ctx.rank, "end");
      },
      ranks);

  for (int s = 0; s < plan.dims.pp; ++s) {
    const int r = plan.dims.rank({0, 0, s});
    const int source = sampled[static_cast<size_t>(s)];
    PlannedRank p;
    p.rank = r;
    p.coord = plan.dims.coord(r);
    p.stats = mesh.peak_stats(source);
    p.windows = mesh.windows(source);
    p.model_state_bytes = state[static_cast<size_t>(source)];
    if (source != r) {
      p.image_of = source;
      for (PeakWindow& w : p.windows)
        w.phase = stage_image_phase(w.phase, s);
      recorders[static_cast<size_t>(r)] =
          stage_image(recorders[static_cast<size_t>(source)], plan.dims, s);
    }
    plan.ranks.push_back(p);
  }
  plan.recorders = std::move(recorders);
  plan.timeline = mesh.timeline().samples(); // one column per stage (timeline_gpus)
  return plan;
}

void derive_rates(PlanFigures& f) {
  f.peak_bytes = 0;
  for (const StageFigures& s : f.stages)
    f.peak_bytes = std::max(f.peak_bytes, s.peak_bytes);
  f.fits = f.peak_bytes <= f.gpu_memory_bytes;
  f.tokens_per_s_per_gpu = f.tflops_per_gpu = f.mfu = 0;
  if (f.step_seconds <= 0 || f.world <= 0)
    return;
  const double per_gpu_second = 1.0 / (f.step_seconds * f.world);
  f.tokens_per_s_per_gpu = static_cast<double>(f.tokens_per_step) * per_gpu_second;
  f.tflops_per_gpu = f.flops * per_gpu_second / 1e12;
  f.mfu = f.peak_flops > 0 ? f.model_flops * per_gpu_second / f.peak_flops : 0;
}

void check_precision_on(const std::string& precision, const GpuSpec& gpu) {
  if (precision == "fp8" && gpu.peak_flops(Dtype::FP8) <= 0)
    throw std::invalid_argument("--precision fp8 needs FP8 tensor cores, and the " + gpu.name + " (" +
                                to_string(gpu.arch) +
                                ") has none: plan on Hopper (h100, h200, h800), Ada (4090, l4) or "
                                "Blackwell (b200, gb200), or with bf16");
}

PlanFigures plan_figures(const Plan& plan, const Prediction& prediction,
                         const ClusterSpec& cluster, const std::string& precision) {
  PlanFigures f;
  for (int s = 0; s < plan.dims.pp; ++s) {
    std::vector<const PlannedRank*> members;
    for (const auto& r : plan.ranks)
      if (r.coord.pp == s)
        members.push_back(&r);
    const bool alike = std::all_of(members.begin(), members.end(), [&](const PlannedRank* r) {
      return r->stats.peak_by_category == members.front()->stats.peak_by_category &&
             r->model_state_bytes == members.front()->model_state_bytes;
    });
    for (const PlannedRank* r : members) {
      StageFigures e;
      e.stage = s;
      e.tp_rank = alike ? -1 : r->coord.tp;
      e.peak_bytes = r->stats.peak;
      e.model_state_bytes = r->model_state_bytes;
      e.peak_by_category = r->stats.peak_by_category;
      e.windows = r->windows;
      f.stages.push_back(e);
      if (alike)
        break;
    }
  }
  f.world = plan.dims.world;
  f.tokens_per_step = plan.tokens_per_step;
  f.step_seconds = prediction.step_time_s;
  f.flops = prediction.flops;
  f.model_flops = prediction.model_flops;
  f.peak_flops = cluster.gpu.peak_flops(parse_dtype(precision));
  f.gpu_memory_bytes = static_cast<int64_t>(cluster.gpu.mem_bytes);
  derive_rates(f);
  return f;
}

PlanFigures plan_on(const TrainConfig& config, const ClusterSpec& cluster, Prediction* prediction,
                    Plan* plan_out, const PredictOptions& target) {
  check_precision_on(config.precision, cluster.gpu);
  Plan plan;
  try {
    PlanRunOptions run;
    run.timeline = plan_out != nullptr; // only a plan handed back shows its memory over time
    run.node_size = cluster.gpus_per_node;
    plan = make_plan(config, kPlanCapacity, kPlanSteps, run);
  } catch (const OutOfMemory& e) {
    // No GPU holds kPlanCapacity: say what did not fit, not the sentinel it was held against.
    std::string what = e.what();
    what = what.substr(0, what.rfind("; capacity"));
    throw OutOfMemory(fmt::format(
        "this plan needs more than {} on one GPU, far more than any GPU has ({}); fits: no",
        format_bytes(kPlanCapacity), what));
  }
  PredictOptions options = target;
  options.dtype = parse_dtype(config.precision); // the math of the planned run
  if (options.dtype == Dtype::FP8) { // the blocks' GEMMs in FP8, the rest in bf16
    options.dtype = Dtype::BF16;
    options.fp8 = true;
  }
  options.images = true; // the GPUs not executed are images of those that were
  options.tp = config.tp;
  options.overlap_tensor_parallel = options.overlap_tensor_parallel || config.tp_comm_overlap;
  const Prediction p = predict(plan.recorders, plan.samples_per_step, cluster, options);
  PlanFigures f = plan_figures(plan, p, cluster, config.precision);
  if (prediction)
    *prediction = p;
  if (plan_out)
    *plan_out = std::move(plan);
  return f;
}

} // namespace meshsim
