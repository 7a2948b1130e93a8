// The mesh engine: data × tensor × pipeline parallelism, with ZeRO on the data-parallel
// dimension. It composes the pieces in the order Megatron-LM and torchtitan do:
//
//   1. build the whole model on the host (nothing charged), with the run's seed, so every
//      layout starts from the weights `single` starts from;
//   2. tensor parallel: apply the plan by module name (this rank keeps its shards), with
//      sequence parallelism if asked;
//   3. pipeline parallel: keep this rank's stage, a contiguous run of the model's children, or
//      with V virtual stages its V chunks r, r+P, ... of the model cut into P·V (Megatron's
//      interleaved placement), the pipeline then a ring;
//   4. data parallel with ZeRO over the ranks that hold the same part: every parameter is in
//      one parameter group sharded over the "dp_shard_cp" group (= dp while cp = 1 and
//      without HSDP) and, with HSDP (--dp-shard), averaged across the "dp_replicate" group
//      too; its flat buffers, allocated on this rank's GPU as `parameters`, take over the
//      stage's parameters, so the GPU is charged once for what it keeps and never for the
//      rest. ZeRO 3 gathers each block's parameters for its forward and backward in every
//      micro-batch the schedule runs, and reduce-scatters its gradients after each
//      micro-batch's backward of it, as FSDP2 does (docs/zero.md).
//
// A step splits the replica's batch into micro-batches and runs them through the pipeline
// schedule (or, with one stage, forward and backward in turn), then averages gradients over
// the dp_cp group and takes the optimizer step on this rank's part; under sequence parallelism,
// the gradients of the parameters that saw part of the sequence are then summed over the tp
// group too (Megatron's all-reduce of the layernorm gradients). Layout: mesh/parallel_dims.h.
//
// The class holds the rank's parts and drives a step; the pieces of work are functions of
// their own: a step's micro-batches (splitting the batch, running them, their dropout draws)
// in parallel/micro_batches.h; wiring the pipeline, evaluation through the chunks and
// dealing the stages' parameters back into model order below.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "models/layers/flops.h"
#include "memory/allocator.h"
#include "models/family.h"
#include "mesh/parallel_dims.h"
#include "models/gpt.h"
#include "models/layers/moe.h"
#include "models/layers/positions.h"
#include "parallel/context/context_parallel.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/fp8_state.h"
#include "parallel/micro_batches.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/replica.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/tied_embedding.h"
#include "parallel/tensor/sequence_parallel.h"
#include "parallel/strategy.h"
#include "parallel/tensor/tensor_parallel.h"
#include "parallel/data/zero.h"

namespace meshsim {
namespace mesh_engine {

// Tags of the point-to-point messages this file sends (far from the pipeline executor's).
constexpr int kTagEvalActivations = 1 << 28;
constexpr int kTagParameters = (1 << 28) + 1;

// The rank's coordinate with another pipeline stage.
int rank_at_stage(const ParallelDims& dims, ParallelCoord c, int stage) {
  c.pp = stage;
  return dims.rank(c);
}

/// The pipeline around this rank's stage: its chunks (as the module ZeRO runs holds them,
/// chunk after chunk) and its neighbours; with virtual stages the last stage's chunk feeds the
/// first stage's next chunk, a ring.
PipelineStage wire_pipeline(torch::nn::Sequential module, const std::vector<size_t>& chunk_sizes,
                            const ParallelDims& dims, const ParallelCoord& coord, int V) {
  PipelineStage pipe;
  pipe.module = module;
  pipe.stage = coord.pp;
  pipe.stages = dims.pp;
  const int P = dims.pp;
  if (V > 1) {
    size_t begin = 0;
    for (size_t n : chunk_sizes) {
      std::vector<size_t> indices(n);
      std::iota(indices.begin(), indices.end(), begin);
      pipe.chunks.push_back(children_module(module, indices));
      begin += n;
    }
  }
  if (coord.pp > 0 || V > 1) pipe.prev_rank = rank_at_stage(dims, coord, (coord.pp + P - 1) % P);
  if (coord.pp + 1 < P || V > 1) pipe.next_rank = rank_at_stage(dims, coord, (coord.pp + 1) % P);
  return pipe;
}

/// This stage's actions of the schedule, after a dry run: never run one that would deadlock.
std::vector<Action> stage_actions(const StrategyOptions& options, const ParallelDims& dims,
                                  int stage, int micro_batches) {
  const Schedule schedule =
      make_schedule(options.schedule, dims.pp, micro_batches, options.virtual_stages);
  const DryRun check = dry_run(schedule);
  if (!check.ok)
    throw std::logic_error(fmt::format("{} schedule: {}", options.schedule, check.error));
  return schedule[static_cast<size_t>(stage)];
}

/// The optimizer step on this rank's part, recorded as one compute region with its counted
/// work (the ZeRO all-gathers fall inside it).
void recorded_optimizer_step(RankContext& ctx, ZeroDataParallel& zero,
                             const OptimizerOptions& optimizer, int64_t numel, int64_t step,
                             bool finite) {
  const auto t = ctx.mark();
  zero.step(step, finite);
  ctx.record_compute("optimizer", step, t);
  attach_work(ctx.recorder.compute.back(),
              {optimizer_work(numel, optimizer.name, optimizer.momentum != 0)});
  ctx.sample_memory(step, "optimizer");
}

/// The mean over the world of the replicas' mean losses, weighted by their samples.
double global_mean_loss(RankContext& ctx, const Group& world, double local_mean, int64_t samples) {
  CategoryScope scope(MemoryCategory::Communication);
  torch::Tensor stats = torch::tensor(
      {local_mean * static_cast<double>(samples), static_cast<double>(samples)}, torch::kFloat64);
  ctx.comm.all_reduce(stats, ReduceOp::Sum, world);
  const auto* s = stats.data_ptr<double>();
  return s[1] > 0 ? s[0] / s[1] : 0.0;
}

/// Runs `x` through this rank's chunks in turn (one without virtual stages); the messages
/// between two ranks come in chunk order on both sides. Returns the last chunk's output.
torch::Tensor forward_through_chunks(RankContext& ctx, const PipelineStage& pipe,
                                     torch::nn::Sequential model, torch::Tensor x) {
  const int V = pipe.virtual_stages(), chunks = pipe.stages * V;
  torch::Tensor out;
  for (int k = 0; k < V; ++k) {
    const int c = pipe.stage + k * pipe.stages;  // the virtual stage
    if (c > 0) x = ctx.comm.recv(pipe.prev_rank, kTagEvalActivations);
    torch::nn::Sequential chunk = V == 1 ? model : pipe.chunks[static_cast<size_t>(k)];
    out = chunk->forward(x);
    if (c < chunks - 1) ctx.comm.send(out, pipe.next_rank, kTagEvalActivations);
  }
  return out;
}

/// Rank 0 (stage 0's first dp and tp member) receives every other stage's parameters from its
/// counterpart and deals them out in model order: a stage's part is its chunks' parameters,
/// chunk after chunk. The other stages' counterparts send theirs and get an empty list.
std::vector<torch::Tensor> parameters_in_model_order(RankContext& ctx, const ParallelDims& dims,
                                                     const ParallelCoord& coord,
                                                     std::vector<torch::Tensor> mine,
                                                     const std::vector<size_t>& chunk_parameters) {
  if (coord.pp > 0) {  // stages send their part to rank 0, which holds stage 0
    ctx.comm.send(torch::tensor({static_cast<int64_t>(mine.size())}), 0, kTagParameters);
    for (const auto& p : mine) ctx.comm.send(p, 0, kTagParameters);
    return {};
  }
  std::vector<std::vector<torch::Tensor>> parts(static_cast<size_t>(dims.pp));
  parts[0] = std::move(mine);
  for (int s = 1; s < dims.pp; ++s) {
    const int src = dims.rank({0, 0, s});
    const int64_t n = ctx.comm.recv(src, kTagParameters).item<int64_t>();
    for (int64_t i = 0; i < n; ++i) parts[s].push_back(ctx.comm.recv(src, kTagParameters));
  }
  std::vector<torch::Tensor> all;
  std::vector<size_t> taken(parts.size(), 0);
  for (size_t c = 0; c < chunk_parameters.size(); ++c) {
    const size_t s = c % parts.size();
    for (size_t i = 0; i < chunk_parameters[c]; ++i) all.push_back(parts[s].at(taken[s]++));
  }
  return all;
}

// The run's named dimensions: tp, pp and, with HSDP, the shard groups' size.
ParallelDims mesh_dims(int world, const StrategyOptions& options) {
  ParallelSizes sizes;
  sizes.world = world;
  sizes.tp = options.tp;
  sizes.pp = options.pp;
  sizes.cp = options.cp;
  sizes.dp_shard = options.dp_shard;
  sizes.ep = options.ep;
  return ParallelDims::make(sizes);
}

// ZeRO-3's {reader, owner} children: a tied head reads the embedding's weight.
std::vector<std::pair<size_t, size_t>> tied_children(const torch::nn::Sequential& stage) {
  std::vector<std::pair<size_t, size_t>> shared;
  for (size_t r = 0; r < stage->size(); ++r)
    if (const auto* head = stage->ptr(r)->as<TiedHeadImpl>())
      for (size_t o = 0; o < stage->size(); ++o)
        if (stage->ptr(o).get() == head->embedding().ptr().get())
          shared.emplace_back(r, o);
  return shared;
}

// The parameter groups: the dense parameters sharded over dp_shard × cp and averaged across
// the replicas; with expert parallelism the routed experts (`experts`, indices into the
// stage's parameters) in a group of their own over edp, the ranks that hold the same experts,
// their gradients scaled by 1/ep so that they too end averaged over dp × cp
// (parallel/expert/expert_parallel.h).
std::vector<ParamGroup> parameter_groups(const torch::nn::Sequential& stage,
                                         const ParallelDims& dims, int rank,
                                         const std::vector<size_t>& experts) {
  ParamGroup dense = all_parameters(stage, dims.group(rank, "dp_shard_cp"), "dp_shard_cp");
  if (dims.dp_replicate > 1)
    dense.replicate = dims.group(rank, "dp_replicate");
  if (dims.ep == 1 || experts.empty())
    return {dense};
  ParamGroup expert;
  expert.dim = "edp";
  expert.group = dims.group(rank, "edp");
  expert.params = experts;
  expert.gradient_scale = 1.0 / dims.ep;
  std::vector<size_t> rest;
  for (size_t i : dense.params)
    if (std::find(experts.begin(), experts.end(), i) == experts.end())
      rest.push_back(i);
  dense.params = std::move(rest);
  return {dense, expert};
}

/// Sequence parallelism's partial gradients summed over the tp group: in .grad for ZeRO 0 and
/// 1; for 2 and 3 the parts of this rank's gradient shards they cover (reduce-scatter over dp
/// and the sum over tp are both linear, so their order does not matter; the tp peers have
/// the same flat layout, so the same parts).
void sum_sequence_gradients(ZeroDataParallel& zero, const std::vector<torch::Tensor>& params,
                            Communicator& comm, const Group& tp) {
  if (zero.stage() < 2 || tp.size() == 1 || params.empty()) {
    all_reduce_sequence_parallel_gradients(params, comm, tp);
    return;
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts = zero.shard_gradients_of(params);
  torch::Tensor flat;
  {
    CategoryScope scope(MemoryCategory::Communication);
    flat = torch::cat(parts);
  }
  if (flat.numel() == 0)
    return;
  comm.all_reduce(flat, ReduceOp::Sum, tp);
  int64_t offset = 0;
  for (auto& part : parts) {
    part.copy_(flat.narrow(0, offset, part.numel()));
    offset += part.numel();
  }
}

// The model's parallel plan; empty for a family without one (cnn, lenet, resnet50: --tp
// refuses them, and a pipeline cuts them at every child with parameters).
ParallelPlan model_plan(const StrategyOptions& options) {
  return model_family(options.model).parallel_plan ? parallel_plan(options.model, options.shape)
                                                   : ParallelPlan{};
}

class HybridStrategy final : public Strategy {
public:
  HybridStrategy(RankContext& ctx, const StrategyOptions& options)
      : ctx_(ctx), options_(options),
        dims_(mesh_dims(ctx.world_size, options)),
        coord_(dims_.coord(ctx.rank)), tp_(dims_.group(ctx.rank, "tp")),
        cp_(dims_.group(ctx.rank, "cp")),
        world_(Group::world(ctx.world_size)),
        micro_batches_(options.schedule == "naive" && dims_.pp > 1 ? 1 : options.micro_batches),
        plan_(model_plan(options)) {
    stage_ = build_stage();
    for (const auto& module : stage_->modules()) // the last stage's head, split over tp
      if (auto* head = module->as<VocabParallelHeadImpl>()) vocab_head_ = head;
    loss_ = vocab_head_ ? TrainingLoss(ctx.comm, tp_, coord_.tp) : TrainingLoss(options.loss_upcast);
    options_.initial.reset(); // the weights are in the stage: the host's copy may go
    std::vector<ParamGroup> groups = parameter_groups(stage_, dims_, ctx.rank, experts_);
    // The optimizer updates this rank's shard of each group (ZeRO >= 1) or all of its part.
    const auto params = stage_->parameters();
    for (const ParamGroup& group : groups) {
      int64_t numel = 0;
      for (size_t i : group.params)
        numel += params[i].numel();
      const int shards = group.group.size();
      optimizer_numel_ += options.zero >= 1 ? (numel + shards - 1) / shards : numel;
    }
    const Fp8Footprint fp8 =
        options.fp8 ? fp8_footprint(stage_, groups, options.zero) : Fp8Footprint{};
    ZeroOptions zero;
    zero.stage = options.zero;
    zero.bucket_mb = options.bucket_mb;
    zero.optimizer = options.optimizer;
    zero.overlap = options.overlap;
    zero.reshard_after_forward = options.reshard_after_forward;
    zero.reduce_fp32 = options.reduce_fp32;
    zero.distributed_optimizer = options.distributed_optimizer;
    zero.shared_children = tied_children(stage_);
    zero_ = std::make_unique<ZeroDataParallel>(ctx, stage_, std::move(groups), zero);
    if (options.sequence_parallel && dims_.tp > 1)
      sequence_params_ = sequence_parallel_parameters(stage_, plan_);
    pipe_ = wire_pipeline(zero_->module(), chunk_sizes_, dims_, coord_, options.virtual_stages);
    if (options.pp_scatter_gather) pipe_.scatter_gather = tp_;
    if (dims_.pp > 1) actions_ = stage_actions(options, dims_, coord_.pp, micro_batches_);
    if (options.fp8) fp8_state_ = allocate_fp8_state(fp8, options.device);
    ctx.sample_memory(0, "model");
  }

  double step(const Batch& whole, int64_t step_number) override {
    zero_->zero_grad();
    std::vector<torch::Tensor> inputs, targets;
    double local_loss = 0;
    {
      CategoryScope scope(MemoryCategory::Activations);
      const Batch batch = context_shard(whole);  // this cp rank's tokens, at their positions
      PositionsScope positions(positions_of(batch));
      split_micro_batches(ctx_, batch, compute_dtype(options_), micro_batches_, step_number,
                          inputs, targets);
      pipe_.dropout = micro_batch_draws(options_, dims_, coord_, batch, inputs, micro_batches_,
                                        step_number);
      pipe_.loss_factors = loss_factors(batch.size(), zero_->optimizer()->loss_scale());
      const SplitLogits split(vocab_head_);  // the loss takes them vocab-parallel
      local_loss = forward_backward(ctx_, pipe_, actions_, loss_, inputs, targets, batch.size(),
                                    step_number, zero_->optimizer()->loss_scale());
    }
    zero_->finish_gradients(step_number);
    // After the dp reductions, as Megatron does: the cost model takes the reductions right
    // after a backward for its gradient buckets.
    sum_sequence_gradients(*zero_, sequence_params_, ctx_.comm, tp_);
    // Then the two copies of a tied word embedding (first and last stage) sum theirs.
    all_reduce_word_embedding_grads(ctx_.comm, tied_);
    ctx_.sample_memory(step_number, "gradients");
    // Every rank holds a different part (dp shards, tp and pp parts): all of them agree.
    const bool finite = gradients_finite(ctx_, *zero_->optimizer(), world_);
    recorded_optimizer_step(ctx_, *zero_, options_.optimizer, optimizer_numel_, step_number,
                            finite);
    return global_mean_loss(ctx_, world_, reports_loss() ? local_loss : 0.0,
                            reports_loss() ? whole.size() : 0);
  }

  DataShard data_shard(const RankContext&) const override { return {dims_.dp, coord_.dp}; }

  std::pair<int64_t, int64_t> evaluate(const Batch& whole) override {
    const Batch batch = context_shard(whole);  // each cp rank scores its own tokens
    PositionsScope positions(positions_of(batch));
    auto model = zero_->module();
    model->eval();
    torch::Tensor out = forward_through_chunks(
        ctx_, pipe_, model, model_inputs(batch.inputs, compute_dtype(options_)));
    model->train();
    if (!reports_loss()) return {0, 0};
    return {out.argmax(-1).eq(batch.targets).sum().item<int64_t>(), batch.targets.numel()};
  }

  std::vector<torch::Tensor> full_parameters() override {
    std::vector<torch::Tensor> mine;
    if (dims_.tp > 1)  // whole over dp (ZeRO 3 gathers), then over tp; copies: ZeRO 3 frees
      zero_->with_full_parameters([&] {
        mine = meshsim::full_parameters(stage_, ctx_.comm, tp_);
        for (auto& p : mine) p = p.clone();
      });
    else
      mine = zero_->full_parameters();  // whole over dp
    if (dims_.ep > 1) { // the routed experts whole over ep
      std::vector<torch::Tensor> slices;
      for (size_t i : experts_)
        slices.push_back(mine[i]);
      slices = gather_experts(slices, ctx_.comm, dims_.group(ctx_.rank, "ep"));
      for (size_t k = 0; k < experts_.size(); ++k)
        mine[experts_[k]] = slices[k];
    }
    // The head's copy of a tied embedding is not in the single-device model: one copy is.
    if (tied_.copy_index >= 0) mine.erase(mine.begin() + tied_.copy_index);
    if (coord_.dp != 0 || coord_.tp != 0 || coord_.cp != 0) return {};
    return parameters_in_model_order(ctx_, dims_, coord_, std::move(mine), chunk_parameters_);
  }

  bool checkpoints_per_rank() const override { return true; }
  void save_state(torch::serialize::OutputArchive& archive) const override { zero_->save(archive); }
  void load_state(torch::serialize::InputArchive& archive) override { zero_->load(archive); }
  torch::nn::Sequential eval_model() override { return zero_->module(); }
  torch::nn::Sequential model() override { return stage_; }
  Optimizer* optimizer() override { return zero_->optimizer(); }

private:
  torch::nn::Sequential build_stage() {
    ModelOptions model_options;
    model_options.seed = options_.seed;
    model_options.rank = ctx_.rank;
    model_options.shape = options_.shape;
    model_options.attention = options_.attention;
    model_options.eager_elementwise = options_.eager_elementwise;
    model_options.dtype = compute_dtype(options_);
    ensure_kernels_for(model_options.dtype);
    model_options.device = options_.device;
    model_options.initial = options_.initial;
    torch::nn::Sequential full, stage;
    {
      GpuGuard host(nullptr);  // each GPU is charged only for the part it keeps
      full = build_model(options_.model, model_options);
      // A tied head with a pipeline: the last stage's head is a copy of the word embedding,
      // a head of its own (so tensor parallelism splits it over the vocabulary).
      const torch::Tensor word =
          dims_.pp > 1 ? tied_word_embedding(full, plan_.vocab_head) : torch::Tensor();
      if (word.defined() && coord_.pp == dims_.pp - 1)
        full = with_head_copy(full, plan_.vocab_head, word);
      if (dims_.tp > 1)
        parallelize_tensor(full, plan_, ctx_.comm, tp_, coord_.tp,
                           options_.sequence_parallel);
      if (dims_.cp > 1) { // every attention module's core brings K/V from the cp group
        parallelize_context(full, plan_, ctx_.comm, cp_, options_.cp_comm,
                            options_.attention == AttentionKind::Fused);
        split_moe_sequences(full, ctx_.comm, cp_); // a balancing loss over whole sequences
      }
      if (dims_.ep > 1) // each rank keeps its slice of the routed experts
        parallelize_experts(full, ctx_.comm, dims_.group(ctx_.rank, "ep"), options_.node_size,
                            options_.moe_dispatch);
      // Parameter tensors of every chunk, in model order, for full_parameters(); and the
      // children of this rank's chunks, which form its stage.
      const int chunks = dims_.pp * options_.virtual_stages;
      std::vector<size_t> mine;
      for (int c = 0; c < chunks; ++c) {
        const std::vector<size_t> indices =
            stage_children(full, plan_, chunks, c, options_.stage_layers);
        chunk_parameters_.push_back(children_module(full, indices)->parameters().size());
        if (c % dims_.pp != coord_.pp) continue;
        chunk_sizes_.push_back(indices.size());
        mine.insert(mine.end(), indices.begin(), indices.end());
      }
      stage = dims_.pp > 1 ? children_module(full, mine) : full;
      if (word.defined()) note_tied_embedding(stage, word);
      set_recompute(stage, options_.recompute);
      experts_ = expert_parameter_indices(stage);
    }
    return stage;
  }

  // The first and last stage note the weight whose gradient their embedding group sums: the
  // embedding's, or the head's copy (charged to the last stage's GPU with its other
  // parameters). A copy split over the vocabulary (parallelize_tensor's rule: tp > 1 and a
  // vocabulary that divides) pairs with the first stage's rows of its shard.
  void note_tied_embedding(const torch::nn::Sequential& stage, const torch::Tensor& word) {
    if (coord_.pp != 0 && coord_.pp != dims_.pp - 1) return;
    tied_.group = dims_.embedding_group(ctx_.rank);
    if (coord_.pp == 0) {
      tied_.weight = word;
      if (dims_.tp > 1 && word.size(0) % dims_.tp == 0) {
        tied_.tp = tp_;
        tied_.tp_index = coord_.tp;
        tied_.rows = word.size(0) / dims_.tp;
      }
      return;
    }
    const auto params = stage->named_parameters();
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].key() == plan_.vocab_head + ".weight") {
        tied_.weight = params[i].value();
        tied_.copy_index = static_cast<int>(i);
      }
  }

  // The factor each micro-batch's loss reaches backward with: its share of the replica's
  // batch of `rows` samples (tensor_split's sizes) times the loss scale. A mixture of experts'
  // balancing loss takes the same (MoeLossScale).
  std::vector<double> loss_factors(int64_t rows, double scale) const {
    std::vector<double> factors;
    const int64_t M = micro_batches_;
    for (int64_t m = 0; m < M && rows > 0; ++m) {
      const int64_t size = rows / M + (m < rows % M ? 1 : 0);
      factors.push_back(static_cast<double>(size) / static_cast<double>(rows) * scale);
    }
    return factors;
  }

  // The last stage's first tensor-parallel member speaks for its replica's tokens (each cp
  // rank for its own share of them: the same number of tokens on each).
  bool reports_loss() const { return coord_.pp == dims_.pp - 1 && coord_.tp == 0; }

  // Context parallelism: this rank's two chunks of every sample's tokens and targets
  // (context_parallel.h); the batch itself without it.
  Batch context_shard(const Batch& batch) const {
    if (dims_.cp == 1 || batch.size() == 0) return batch;
    return {cp_shard_sequence(batch.inputs, dims_.cp, coord_.cp),
            batch.targets.defined() ? cp_shard_sequence(batch.targets, dims_.cp, coord_.cp)
                                    : batch.targets,
            batch.samples};
  }
  // The positions of those tokens in their sequence; undefined (0..T-1) without cp.
  torch::Tensor positions_of(const Batch& batch) const {
    if (dims_.cp == 1 || batch.size() == 0) return {};
    return cp_positions(batch.inputs.size(1) * dims_.cp, dims_.cp, coord_.cp,
                        batch.inputs.options());
  }

  RankContext& ctx_;
  StrategyOptions options_;
  ParallelDims dims_;
  ParallelCoord coord_;
  Group tp_, cp_, world_;
  int micro_batches_;
  ParallelPlan plan_;  // the model's, read once: tensor and sequence parallel, the cuts
  int64_t optimizer_numel_ = 0;
  torch::nn::Sequential stage_;
  std::vector<torch::Tensor> sequence_params_; // their gradients are partial (tp group)
  std::vector<size_t> experts_; // the routed experts' parameters (indices into stage_'s)
  VocabParallelHeadImpl* vocab_head_ = nullptr; // a head split over the vocabulary, if here
  TrainingLoss loss_;  // vocab-parallel with that head, else loss_fn
  std::vector<torch::Tensor> fp8_state_; // --precision fp8: parallel/fp8_state.h
  std::unique_ptr<ZeroDataParallel> zero_;
  PipelineStage pipe_;
  std::vector<Action> actions_;
  TiedEmbedding tied_;  // a tied head's copy on the first or last stage, and their group
  std::vector<size_t> chunk_sizes_;       // children of each of this rank's chunks, in order
  std::vector<size_t> chunk_parameters_;  // parameter tensors of every chunk of the model
};

} // namespace mesh_engine

std::unique_ptr<Strategy> make_hybrid(RankContext& ctx, const StrategyOptions& options) {
  return std::make_unique<mesh_engine::HybridStrategy>(ctx, options);
}

} // namespace meshsim
