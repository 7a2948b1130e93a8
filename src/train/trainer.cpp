// The training loop: every rank runs its own RankLoop over its shard of the data, between
// the barrier that ends its setup and its part of the result.
#include "train/trainer.h"

#include <cmath>
#include <csignal>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "data/sampler.h"
#include "memory/allocator.h"
#include "mesh/rank_runner.h"
#include "models/layers/moe.h"
#include "parallel/strategy.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/hf_format.h"
#include "train/progress.h"

namespace meshsim {
namespace {

// The MoE layers of this rank's model, each with its block's index, from its name
// ("block3.mlp"): found once, read after every step.
using MoeLayers = std::vector<std::pair<int64_t, const MoeImpl*>>;
MoeLayers moe_layers(const torch::nn::Sequential& model) {
  MoeLayers layers;
  for (const auto& item : model->named_modules("", /*include_self=*/false))
    if (const auto* moe = item.value()->as<MoeImpl>()) {
      const std::string& name = item.key();
      const size_t digits = name.find_first_of("0123456789");
      layers.emplace_back(digits == std::string::npos ? 0 : std::stoll(name.substr(digits)), moe);
    }
  return layers;
}

// What every MoE layer routed in the step just taken (report/routing.h).
void record_routing(const MoeLayers& layers, int rank, int64_t step,
                    std::vector<RoutingRecord>& out) {
  for (const auto& [layer, moe] : layers) {
    if (!moe->tokens_per_expert().defined())
      continue;
    RoutingRecord r;
    r.step = step;
    r.rank = rank;
    r.layer = layer;
    r.first_expert = moe->first_expert();
    const torch::Tensor& routed = moe->tokens_per_expert();
    r.routed.assign(routed.data_ptr<int64_t>(), routed.data_ptr<int64_t>() + routed.numel());
    const torch::Tensor& ran = moe->expert_load();
    if (ran.defined())
      r.ran.assign(ran.data_ptr<int64_t>(), ran.data_ptr<int64_t>() + ran.numel());
    out.push_back(std::move(r));
  }
}

bool same_use(const MemoryStats& a, const MemoryStats& b) {
  return a.capacity == b.capacity && a.current == b.current &&
         a.current_by_category == b.current_by_category;
}

// One line per GPU in rank order, what its memory held after setup (`setup`, by rank, taken
// by each rank before the barrier that lets any of them train); a run of GPUs holding the
// same is one line ("gpu1-gpu7: ...").
// The GPUs of this process only: another process's are its own to report.
void print_memory_lines(DeviceMesh& mesh, const std::vector<MemoryStats>& setup) {
  const std::vector<int> local = mesh.local_ranks();
  const int n = local.back() + 1;
  for (int first = local.front(); first < n;) {
    const MemoryStats& s = setup[first];
    int last = first;
    while (last + 1 < n && same_use(setup[last + 1], s))
      ++last;
    const std::string names = first == last ? mesh.gpu(first).name()
                                            : mesh.gpu(first).name() + "-" + mesh.gpu(last).name();
    fmt::print(stderr, "{}: {} of {} in use ({})\n", names, format_bytes(s.current),
               format_bytes(s.capacity), describe_use(s, /*skip_empty=*/true));
    first = last + 1;
  }
}

} // namespace

int64_t steps_per_epoch(const TrainConfig& config, int64_t train_samples) {
  // DataParallel loads whole global batches on GPU 0; the others shard the data set the
  // way torch's DistributedSampler does, one shard per data-parallel replica.
  const bool global_loader = config.strategy == "dp";
  const int replicas = global_loader ? 1 : config.gpus / (config.tp * config.pp * config.cp);
  const int64_t batch = global_loader ? config.batch_size * config.gpus : config.batch_size;
  const int64_t samples =
      DistributedSampler(train_samples, replicas, 0, true, config.seed).num_samples();
  // A step cut into micro-batches needs at least one sample per micro-batch: drop a last
  // batch smaller than that, as pipeline engines require whole batches.
  int64_t steps = (samples + batch - 1) / batch;
  if (config.micro_batches > 1 && samples % batch != 0 && samples % batch < config.micro_batches)
    --steps;
  if (steps < 1)
    throw std::invalid_argument(fmt::format(
        "{} training samples per data-parallel replica are fewer than --micro-batches {}", samples,
        config.micro_batches));
  return steps;
}

int64_t last_step(const TrainConfig& config, int64_t train_samples) {
  // --max-steps runs exactly that many steps, through as many epochs as it takes.
  return config.max_steps > 0 ? config.max_steps
                              : steps_per_epoch(config, train_samples) * config.epochs;
}

void check_steps_left(const TrainConfig& config, int64_t train_samples, int64_t resume_step) {
  const int64_t last = last_step(config, train_samples);
  if (resume_step >= last)
    throw std::invalid_argument(
        fmt::format("nothing to train: the checkpoint is at step {} and this run ends at step {} "
                    "({} steps per epoch); raise --epochs or --max-steps",
                    resume_step, last, steps_per_epoch(config, train_samples)));
}

namespace {

// What every rank's loop of one train() shares: the run, its data, its length, and the result
// rank 0 fills.
struct SharedRun {
  const TrainConfig& config;
  DeviceMesh& mesh;
  const DataSplit& data;
  RunFolder* run;
  const CheckpointIdentity& identity;
  int64_t epoch_steps = 0, total_steps = 0;
  StopPoint& stop;
  TrainResult& result;
  std::mutex& result_mutex;
};

// One rank's training loop, from the step it starts at (0, or a checkpoint's) to the last or
// a stop: its batches, steps, metrics, checkpoints and evaluations, and its share of the result.
class RankLoop {
public:
  RankLoop(SharedRun& shared, RankContext& ctx, Strategy& strategy, int64_t start_step)
      : s_(shared), config_(shared.config), ctx_(ctx), strategy_(strategy),
        global_loader_(strategy.rank0_loads_global_batch()), shard_(strategy.data_shard(ctx)),
        eval_shard_(global_loader_ ? DataShard{shared.mesh.world_size(), ctx.rank} : shard_),
        batch_(global_loader_ ? config_.batch_size * shared.mesh.world_size()
                              : config_.batch_size),
        // DataParallel loads whole global batches on GPU 0; the others shard the data set
        // the way torch's DistributedSampler does, one shard per data-parallel replica.
        sampler_(shared.data.train.size(), global_loader_ ? 1 : shard_.replicas,
                 global_loader_ ? 0 : shard_.index, true, config_.seed),
        progress_(shared.total_steps, config_.log_every, config_.progress && ctx.rank == 0),
        step_(start_step), window_start_(ctx.now()) {
    if (config_.shape.moe.experts > 0)
      moe_layers_ = moe_layers(strategy.model());
  }

  void run() {
    for (int64_t epoch = step_ / s_.epoch_steps; step_ < s_.total_steps && !stopped_; ++epoch) {
      run_epoch(epoch);
      if (!stopped_ && (step_ % s_.epoch_steps == 0 || step_ == s_.total_steps))
        end_epoch(epoch);
    }
    if (!stopped_ && !evaluated_at_end_)
      run_evaluation(); // no step ran
    hand_over();
  }

private:
  // Collective on every rank; once per step.
  void save(int64_t at) {
    if (!s_.run || at == saved_step_)
      return;
    saved_step_ = at;
    save_checkpoint(s_.run->dir(), ctx_, strategy_, s_.identity, at, config_.keep_checkpoints);
  }

  void run_evaluation() {
    const Evaluation e = evaluate(ctx_, strategy_, eval_shard_, s_.data.test, config_.eval_limit,
                                  config_.batch_size);
    accuracy_ = e.accuracy;
    test_samples_ = e.samples;
    eval_peak_ = std::max(eval_peak_, e.peak_bytes);
  }

  // Batch `s` of the epoch's `indices` (none on the ranks a global loader feeds).
  Batch batch_at(const std::vector<int64_t>& indices, int64_t s) const {
    Batch b;
    if (!indices.empty()) {
      CategoryScope scope(MemoryCategory::Activations);
      const auto first = indices.begin() + s * batch_;
      const auto last = indices.begin() + std::min<int64_t>((s + 1) * batch_, indices.size());
      std::tie(b.inputs, b.targets) = gather_batch(s_.data.train, {first, last});
      // Each row's index in the step's global batch (dropout's masks): the sampler deals the
      // epoch's order round-robin, so row j of replica r is the global batch's j·R + r.
      const int replicas = global_loader_ ? 1 : shard_.replicas;
      const int replica = global_loader_ ? 0 : shard_.index;
      {
        GpuGuard host(nullptr); // indices that kernels read as arguments, not activations
        b.samples =
            torch::arange(static_cast<int64_t>(last - first), torch::kLong) * replicas + replica;
      }
      if (ctx_.mesh.on_card())
        b = b.to(torch::Device(torch::kCUDA, 0));
    }
    return b;
  }

  // --inject-fault: this rank leaves the run before the step.
  void inject_fault() const {
    if (ctx_.rank != config_.fault_rank || step_ + 1 != config_.fault_step)
      return;
    if (s_.mesh.c10d_world()) {
      // A process of its own dies as a crashed node's does: at once, saying nothing.
      fmt::print(stderr, "meshsim: rank {} kills its process at step {} (--inject-fault)\n",
                 ctx_.rank, step_ + 1);
      std::raise(SIGKILL);
    }
    throw RankLeft(
        fmt::format("rank {} left the run at step {} (--inject-fault)", ctx_.rank, step_ + 1));
  }

  void run_epoch(int64_t epoch) {
    sampler_.set_epoch(epoch);
    std::vector<int64_t> indices;
    if (!global_loader_ || ctx_.rank == 0)
      indices = sampler_.indices();
    for (int64_t s = step_ % s_.epoch_steps; s < s_.epoch_steps && step_ < s_.total_steps; ++s) {
      const Batch b = batch_at(indices, s);
      inject_fault();
      const double t0 = ctx_.now();
      last_loss_ = strategy_.step(b, step_ + 1);
      train_seconds_ += ctx_.now() - t0;
      ++step_;
      state_bytes_ = std::max(state_bytes_, model_state_bytes(ctx_.gpu));
      record_routing(moe_layers_, ctx_.rank, step_, routing_); // none without experts
      window_samples_ += global_loader_ ? b.size() : b.size() * shard_.replicas;
      if (ctx_.rank == 0 && !std::isfinite(last_loss_))
        s_.stop.request(StopReason::Diverged,
                        fmt::format("the loss is {} at step {}: training diverged (try a lower "
                                    "--lr)",
                                    last_loss_, step_));
      if (s_.stop.should_stop(step_)) {
        stopped_ = true;
        break;
      }
      if (config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0)
        save(step_);
      if (ctx_.rank == 0)
        report_step(epoch);
    }
  }

  // Rank 0: metrics.jsonl every --log-every steps and at the end, and the progress bar.
  void report_step(int64_t epoch) {
    const bool log = step_ % config_.log_every == 0 || step_ == s_.total_steps;
    const double elapsed = ctx_.now() - window_start_;
    const double rate = elapsed > 0 ? window_samples_ / elapsed : 0;
    if (log && s_.run) {
      s_.run->log_metrics({{"step", step_},
                           {"epoch", epoch + 1},
                           {"loss", last_loss_},
                           {"lr", config_.optimizer.lr},
                           {"samples_per_s", rate}});
    }
    progress_.update(
        step_, fmt::format("epoch {} loss {:.4f} {:.0f} samples/s", epoch + 1, last_loss_, rate));
    if (log) {
      window_start_ = ctx_.now();
      window_samples_ = 0;
    }
  }

  void end_epoch(int64_t epoch) {
    // The training is on disk before the last evaluation: a failure there costs nothing.
    if (step_ == s_.total_steps)
      save(step_);
    run_evaluation();
    evaluated_at_end_ = step_ == s_.total_steps;
    if (ctx_.rank == 0) {
      progress_.finish();
      fmt::print(stderr, "epoch {}: test accuracy {:.2f}%\n", epoch + 1, 100 * accuracy_);
      if (s_.run)
        s_.run->log_scalar("test/accuracy", accuracy_, step_);
    }
  }

  // The last checkpoint, and this rank's part of the result (rank 0's: the whole of it).
  void hand_over() {
    std::vector<torch::Tensor> parameters;
    {
      GpuGuard host(nullptr); // the caller's copy is not GPU memory
      parameters = strategy_.full_parameters();
    }
    // A diverged model is not worth resuming: keep the last sound checkpoint as `latest`.
    if (s_.stop.reason() != StopReason::Diverged)
      save(step_);
    TrainResult& result = s_.result;
    result.eval_peak_bytes[ctx_.rank] = eval_peak_; // each rank its own element
    result.model_state_bytes[ctx_.rank] = state_bytes_;
    if (!routing_.empty()) {
      std::lock_guard<std::mutex> lock(s_.result_mutex);
      result.routing.insert(result.routing.end(), routing_.begin(), routing_.end());
    }
    if (ctx_.rank == 0) {
      progress_.finish();
      std::lock_guard<std::mutex> lock(s_.result_mutex);
      result.steps = step_;
      result.final_loss = last_loss_;
      result.test_accuracy = accuracy_;
      result.test_samples = test_samples_;
      result.train_seconds = train_seconds_;
      result.final_parameters = std::move(parameters);
    }
  }

  MoeLayers moe_layers_;               // a mixture of experts' layers, whose routing is recorded
  std::vector<RoutingRecord> routing_; // this rank's, every step
  SharedRun& s_;
  const TrainConfig& config_;
  RankContext& ctx_;
  Strategy& strategy_;
  const bool global_loader_;
  const DataShard shard_, eval_shard_;
  const int64_t batch_;
  DistributedSampler sampler_;
  Progress progress_;
  int64_t step_;
  int64_t saved_step_ = -1;
  double last_loss_ = 0, train_seconds_ = 0, accuracy_ = 0;
  int64_t eval_peak_ = 0, state_bytes_ = 0, test_samples_ = 0;
  bool evaluated_at_end_ = false, stopped_ = false;
  double window_start_;
  int64_t window_samples_ = 0;
};

} // namespace

TrainResult train(const TrainConfig& config, DeviceMesh& mesh, const DataSplit& data,
                  RunFolder* run, const std::atomic<int>* stop_signal,
                  std::optional<VerifiedCheckpoint> resume) {
  const int world = mesh.world_size();
  const CheckpointIdentity identity = checkpoint_identity(config);
  if (!resume && !config.resume.empty())
    resume = verify_checkpoint(config.resume, identity, world);
  if (resume)
    check_steps_left(config, data.train.size(), resume->manifest.step);
  StrategyOptions options = strategy_options(config);
  // --init-from: the folder's weights, read once for every rank (each builds its parts from
  // them); a resumed run's checkpoint holds its weights instead.
  if (!resume && !config.init_from.empty())
    options.initial = std::make_shared<const std::vector<std::pair<std::string, torch::Tensor>>>(
        read_hf_weights(config, config.init_from));

  TrainResult result;
  result.eval_peak_bytes.assign(world, 0);
  result.model_state_bytes.assign(world, 0);
  std::mutex result_mutex;
  StopPoint stop(stop_signal);
  stop.across_processes(mesh.c10d_world());
  SharedRun shared{config,
                   mesh,
                   data,
                   run,
                   identity,
                   steps_per_epoch(config, data.train.size()),
                   last_step(config, data.train.size()),
                   stop,
                   result,
                   result_mutex};

  std::vector<MemoryStats> setup_use(world);
  std::mutex setup_mutex;
  auto rank_main = [&](RankContext& ctx) {
    auto strategy = make_strategy(config.strategy, ctx, options);
    TrainPosition start;
    if (resume)
      start = load_checkpoint(*resume, ctx, *strategy);
    {
      // What this GPU holds now, before the barrier lets the others start training while
      // the lines are printed.
      std::lock_guard<std::mutex> lock(setup_mutex);
      setup_use[ctx.rank] = ctx.gpu.stats();
    }
    ctx.comm.barrier(); // every GPU is set up: say what each holds
    if (ctx.rank == mesh.local_ranks().front()) {  // one thread of each process
      {
        std::lock_guard<std::mutex> lock(setup_mutex);
        print_memory_lines(mesh, setup_use);
      }
      if (resume)
        resume->part_bytes = {}; // every rank has loaded its part (the barrier)
    }
    RankLoop(shared, ctx, *strategy, start.step).run();
  };

  result.recorders = run_ranks(mesh, rank_main);
  result.stopped = stop.reason();
  result.stop_message = stop.why();
  return result;
}

} // namespace meshsim
