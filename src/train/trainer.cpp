// The training loop.
#include "train/trainer.h"

#include <cmath>
#include <csignal>
#include <optional>

#include <fmt/format.h>

#include "data/sampler.h"
#include "memory/allocator.h"
#include "mesh/rank_runner.h"
#include "parallel/strategy.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/progress.h"

namespace meshsim {
namespace {

bool same_use(const MemoryStats& a, const MemoryStats& b) {
  return a.capacity == b.capacity && a.current == b.current &&
         a.current_by_category == b.current_by_category;
}

// One line per GPU in rank order, what its memory holds after setup; a run of GPUs holding
// the same is one line ("gpu1-gpu7: ...").
// The GPUs of this process only: another process's are its own to report.
void print_memory_lines(DeviceMesh& mesh) {
  const std::vector<int> local = mesh.local_ranks();
  const int n = local.back() + 1;
  for (int first = local.front(); first < n;) {
    const MemoryStats s = mesh.gpu(first).stats();
    int last = first;
    while (last + 1 < n && same_use(mesh.gpu(last + 1).stats(), s))
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
  const int replicas = global_loader ? 1 : config.gpus / (config.tp * config.pp);
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

TrainResult train(const TrainConfig& config, DeviceMesh& mesh, const DataSplit& data,
                  RunFolder* run, const std::atomic<int>* stop_signal,
                  std::optional<VerifiedCheckpoint> resume) {
  const int world = mesh.world_size();
  const CheckpointIdentity identity = checkpoint_identity(config);
  if (!resume && !config.resume.empty())
    resume = verify_checkpoint(config.resume, identity, world);
  if (resume)
    check_steps_left(config, data.train.size(), resume->manifest.step);
  const int64_t epoch_steps = steps_per_epoch(config, data.train.size());
  const int64_t total_steps = last_step(config, data.train.size());
  const StrategyOptions options = strategy_options(config);

  TrainResult result;
  result.eval_peak_bytes.assign(world, 0);
  result.model_state_bytes.assign(world, 0);
  std::mutex result_mutex;
  StopPoint stop(stop_signal);
  stop.across_processes(mesh.c10d_world());

  auto rank_main = [&](RankContext& ctx) {
    auto strategy = make_strategy(config.strategy, ctx, options);
    TrainPosition start;
    if (resume)
      start = load_checkpoint(*resume, ctx, *strategy);
    ctx.comm.barrier(); // every GPU is set up: say what each holds
    if (ctx.rank == mesh.local_ranks().front()) {  // one thread of each process
      print_memory_lines(mesh);
      if (resume)
        resume->part_bytes = {}; // every rank has loaded its part (the barrier)
    }
    // Collective on every rank; once per step.
    int64_t saved_step = -1;
    auto save = [&](int64_t at) {
      if (!run || at == saved_step)
        return;
      saved_step = at;
      save_checkpoint(run->dir(), ctx, *strategy, identity, at, config.keep_checkpoints);
    };
    // DataParallel loads whole global batches on GPU 0; the others shard the data set the
    // way torch's DistributedSampler does, one shard per data-parallel replica.
    const bool global_loader = strategy->rank0_loads_global_batch();
    const DataShard shard = strategy->data_shard(ctx);
    const DataShard eval_shard = global_loader ? DataShard{world, ctx.rank} : shard;
    const int replicas = global_loader ? 1 : shard.replicas;
    const int sampler_rank = global_loader ? 0 : shard.index;
    const int64_t batch = global_loader ? config.batch_size * world : config.batch_size;
    DistributedSampler sampler(data.train.size(), replicas, sampler_rank, true, config.seed);
    Progress progress(total_steps, config.log_every, config.progress && ctx.rank == 0);
    int64_t step = start.step;
    double last_loss = 0, train_seconds = 0, accuracy = 0;
    int64_t eval_peak = 0, state_bytes = 0, test_samples = 0;
    bool evaluated_at_end = false, stopped = false;
    double window_start = ctx.now();
    int64_t window_samples = 0;
    auto run_evaluation = [&] {
      const Evaluation e =
          evaluate(ctx, *strategy, eval_shard, data.test, config.eval_limit, config.batch_size);
      accuracy = e.accuracy;
      test_samples = e.samples;
      eval_peak = std::max(eval_peak, e.peak_bytes);
    };

    for (int64_t epoch = step / epoch_steps; step < total_steps && !stopped; ++epoch) {
      sampler.set_epoch(epoch);
      std::vector<int64_t> indices;
      if (!global_loader || ctx.rank == 0)
        indices = sampler.indices();
      for (int64_t s = step % epoch_steps; s < epoch_steps && step < total_steps; ++s) {
        Batch b;
        if (!indices.empty()) {
          CategoryScope scope(MemoryCategory::Activations);
          const auto first = indices.begin() + s * batch;
          const auto last = indices.begin() + std::min<int64_t>((s + 1) * batch, indices.size());
          std::tie(b.inputs, b.targets) = gather_batch(data.train, {first, last});
          if (ctx.mesh.on_card())
            b = b.to(torch::Device(torch::kCUDA, 0));
        }
        if (ctx.rank == config.fault_rank && step + 1 == config.fault_step && mesh.c10d_world()) {
          // A process of its own dies as a crashed node's does: at once, saying nothing.
          fmt::print(stderr, "meshsim: rank {} kills its process at step {} (--inject-fault)\n",
                     ctx.rank, step + 1);
          std::raise(SIGKILL);
        }
        if (ctx.rank == config.fault_rank && step + 1 == config.fault_step)
          throw RankLeft(
              fmt::format("rank {} left the run at step {} (--inject-fault)", ctx.rank, step + 1));
        const double t0 = ctx.now();
        last_loss = strategy->step(b, step + 1);
        train_seconds += ctx.now() - t0;
        ++step;
        state_bytes = std::max(state_bytes, model_state_bytes(ctx.gpu));
        window_samples += global_loader ? b.size() : b.size() * shard.replicas;
        if (ctx.rank == 0 && !std::isfinite(last_loss))
          stop.request(StopReason::Diverged,
                       fmt::format("the loss is {} at step {}: training diverged (try a lower "
                                   "--lr)",
                                   last_loss, step));
        if (stop.should_stop(step)) {
          stopped = true;
          break;
        }
        if (config.checkpoint_every > 0 && step % config.checkpoint_every == 0)
          save(step);
        if (ctx.rank != 0)
          continue;

        const bool log = step % config.log_every == 0 || step == total_steps;
        const double elapsed = ctx.now() - window_start;
        const double rate = elapsed > 0 ? window_samples / elapsed : 0;
        if (log && run) {
          run->log_metrics({{"step", step},
                            {"epoch", epoch + 1},
                            {"loss", last_loss},
                            {"lr", config.optimizer.lr},
                            {"samples_per_s", rate}});
        }
        progress.update(
            step, fmt::format("epoch {} loss {:.4f} {:.0f} samples/s", epoch + 1, last_loss, rate));
        if (log) {
          window_start = ctx.now();
          window_samples = 0;
        }
      }
      if (!stopped && (step % epoch_steps == 0 || step == total_steps)) {
        // The training is on disk before the last evaluation: a failure there costs nothing.
        if (step == total_steps)
          save(step);
        run_evaluation();
        evaluated_at_end = step == total_steps;
        if (ctx.rank == 0) {
          progress.finish();
          fmt::print(stderr, "epoch {}: test accuracy {:.2f}%\n", epoch + 1, 100 * accuracy);
          if (run)
            run->log_scalar("test/accuracy", accuracy, step);
        }
      }
    }
    if (!stopped && !evaluated_at_end)
      run_evaluation(); // no step ran
    std::vector<torch::Tensor> parameters;
    {
      GpuGuard host(nullptr); // the caller's copy is not GPU memory
      parameters = strategy->full_parameters();
    }
    // A diverged model is not worth resuming: keep the last sound checkpoint as `latest`.
    if (stop.reason() != StopReason::Diverged)
      save(step);
    result.eval_peak_bytes[ctx.rank] = eval_peak; // each rank its own element
    result.model_state_bytes[ctx.rank] = state_bytes;
    if (ctx.rank == 0) {
      progress.finish();
      std::lock_guard<std::mutex> lock(result_mutex);
      result.steps = step;
      result.final_loss = last_loss;
      result.test_accuracy = accuracy;
      result.test_samples = test_samples;
      result.train_seconds = train_seconds;
      result.final_parameters = std::move(parameters);
    }
  };

  result.recorders = run_ranks(mesh, rank_main);
  result.stopped = stop.reason();
  result.stop_message = stop.why();
  return result;
}

} // namespace meshsim
