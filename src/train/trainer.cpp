// The training loop.
#include "train/trainer.h"

#include <fmt/format.h>

#include "data/sampler.h"
#include "memory/allocator.h"
#include "mesh/rank_runner.h"
#include "parallel/strategy.h"
#include "train/checkpoint.h"
#include "train/progress.h"

namespace meshsim {
namespace {

// Test accuracy: each data shard scores every replicas-th test sample; the strategy says what
// each rank counts (ranks that share a shard count it once between them).
double evaluate(RankContext& ctx, Strategy& strategy, DataShard shard, const Dataset& test,
                int64_t limit, int64_t batch_size) {
  CategoryScope scope(MemoryCategory::Activations);
  // No-grad rather than inference mode: tensors made in inference mode cannot meet the
  // version-counted parameters that tensor-parallel and ZeRO layers use.
  torch::NoGradGuard no_grad;
  const int64_t n = limit > 0 ? std::min(limit, test.size()) : test.size();
  std::vector<int64_t> mine;
  for (int64_t i = shard.index; i < n; i += shard.replicas) mine.push_back(i);
  int64_t correct = 0, counted = 0;
  for (size_t start = 0; start < mine.size(); start += batch_size) {
    const size_t end = std::min(mine.size(), start + batch_size);
    Batch b;
    std::tie(b.inputs, b.targets) = gather_batch(test, {mine.begin() + start, mine.begin() + end});
    const auto [c, k] = strategy.evaluate(b);
    correct += c;
    counted += k;
  }
  torch::Tensor counts;
  {
    CategoryScope comm_scope(MemoryCategory::Communication);
    counts = torch::tensor({correct, counted}, torch::kInt64);
    ctx.comm.all_reduce(counts, ReduceOp::Sum);
  }
  const auto* c = counts.data_ptr<int64_t>();
  return c[1] > 0 ? static_cast<double>(c[0]) / static_cast<double>(c[1]) : 0.0;
}

std::string memory_line(const VirtualGpu& gpu) {
  const auto s = gpu.stats();
  return fmt::format("{}: {} of {} in use ({})", gpu.name(), format_bytes(s.current),
                     format_bytes(s.capacity), describe_use(s, /*skip_empty=*/true));
}

} // namespace

TrainResult train(const TrainConfig& config, DeviceMesh& mesh, const DataSplit& data,
                  RunFolder* run) {
  const int world = mesh.world_size();
  StrategyOptions options;
  options.model = config.model;
  options.seed = config.seed;
  options.optimizer = config.optimizer;
  options.bucket_mb = config.bucket_mb;
  options.fault_rank = config.fault_rank;
  options.fault_step = config.fault_step;
  options.gpt = config.gpt;
  options.tp = config.tp;
  options.pp = config.pp;
  options.zero = config.zero;
  options.schedule = config.schedule;
  options.micro_batches = config.micro_batches;
  options.recompute = config.recompute == "full";

  TrainResult result;
  std::mutex result_mutex;

  auto rank_main = [&](RankContext& ctx) {
    auto strategy = make_strategy(config.strategy, ctx, options);
    TrainPosition start;
    if (!config.resume.empty()) start = load_checkpoint(config.resume, ctx, *strategy);
    // Collective on every rank; once per step.
    int64_t saved_step = -1;
    auto save = [&](int64_t at) {
      if (!run || at == saved_step) return;
      saved_step = at;
      save_checkpoint(run->dir(), ctx, *strategy, {at});
    };
    // DataParallel loads whole global batches on GPU 0; the others shard the data set the
    // way torch's DistributedSampler does, one shard per data-parallel replica.
    const bool global_loader = strategy->rank0_loads_global_batch();
    const DataShard shard = strategy->data_shard(ctx);
    const DataShard eval_shard = global_loader ? DataShard{world, ctx.rank} : shard;
    if (ctx.rank == 0 || (global_loader && ctx.rank == 1))
      fmt::print(stderr, "{}\n", memory_line(ctx.gpu));
    const int replicas = global_loader ? 1 : shard.replicas;
    const int sampler_rank = global_loader ? 0 : shard.index;
    const int64_t batch = global_loader ? config.batch_size * world : config.batch_size;
    DistributedSampler sampler(data.train.size(), replicas, sampler_rank, true, config.seed);
    // A step cut into micro-batches needs at least one sample per micro-batch: drop a last
    // batch smaller than that, as pipeline engines require whole batches.
    int64_t steps_per_epoch = (sampler.num_samples() + batch - 1) / batch;
    if (config.micro_batches > 1 && sampler.num_samples() % batch != 0 &&
        sampler.num_samples() % batch < config.micro_batches)
      --steps_per_epoch;
    if (steps_per_epoch < 1)
      throw std::invalid_argument(fmt::format(
          "{} training samples per data-parallel replica are fewer than --micro-batches {}",
          sampler.num_samples(), config.micro_batches));
    int64_t total_steps = steps_per_epoch * config.epochs;
    if (config.max_steps > 0) total_steps = std::min(total_steps, config.max_steps);
    if (!config.resume.empty() && start.step >= total_steps)
      throw std::invalid_argument(fmt::format(
          "nothing to train: the checkpoint is at step {} and this run ends at step {} "
          "({} steps per epoch); raise --epochs or --max-steps",
          start.step, total_steps, steps_per_epoch));

    Progress progress(total_steps, config.log_every, config.progress && ctx.rank == 0);
    int64_t step = start.step;
    double last_loss = 0, train_seconds = 0, accuracy = 0;
    bool evaluated_at_end = false;
    double window_start = ctx.now();
    int64_t window_samples = 0;

    for (int64_t epoch = step / steps_per_epoch; epoch < config.epochs && step < total_steps;
         ++epoch) {
      sampler.set_epoch(epoch);
      std::vector<int64_t> indices;
      if (!global_loader || ctx.rank == 0) indices = sampler.indices();
      for (int64_t s = step % steps_per_epoch; s < steps_per_epoch && step < total_steps; ++s) {
        Batch b;
        if (!indices.empty()) {
          CategoryScope scope(MemoryCategory::Activations);
          const auto first = indices.begin() + s * batch;
          const auto last = indices.begin() + std::min<int64_t>((s + 1) * batch, indices.size());
          std::tie(b.inputs, b.targets) = gather_batch(data.train, {first, last});
        }
        const double t0 = ctx.now();
        last_loss = strategy->step(b, step + 1);
        train_seconds += ctx.now() - t0;
        ++step;
        window_samples += global_loader ? b.size() : b.size() * shard.replicas;
        if (config.checkpoint_every > 0 && step % config.checkpoint_every == 0) save(step);
        if (ctx.rank != 0) continue;

        const bool log = step % config.log_every == 0 || step == total_steps;
        const double elapsed = ctx.now() - window_start;
        const double rate = elapsed > 0 ? window_samples / elapsed : 0;
        if (log && run) {
          run->log_metrics({{"step", step},
                            {"epoch", epoch},
                            {"loss", last_loss},
                            {"lr", config.optimizer.lr},
                            {"samples_per_s", rate}});
        }
        progress.update(step, fmt::format("epoch {} loss {:.4f} {:.0f} samples/s", epoch + 1,
                                          last_loss, rate));
        if (log) {
          window_start = ctx.now();
          window_samples = 0;
        }
      }
      if (step % steps_per_epoch == 0 || step == total_steps) {
        accuracy = evaluate(ctx, *strategy, eval_shard, data.test, config.eval_limit, config.batch_size);
        evaluated_at_end = step == total_steps;
        if (ctx.rank == 0) {
          progress.finish();
          fmt::print(stderr, "epoch {}: test accuracy {:.2f}%\n", epoch + 1, 100 * accuracy);
          if (run) run->log_scalar("test/accuracy", accuracy, step);
        }
      }
    }
    if (!evaluated_at_end)  // no step ran (the loop evaluates after the last one)
      accuracy = evaluate(ctx, *strategy, eval_shard, data.test, config.eval_limit, config.batch_size);
    std::vector<torch::Tensor> parameters;
    {
      GpuGuard host(nullptr);  // the caller's copy is not GPU memory
      parameters = strategy->full_parameters();
    }
    save(step);
    if (ctx.rank == 0) {
      progress.finish();
      std::lock_guard<std::mutex> lock(result_mutex);
      result.steps = step;
      result.final_loss = last_loss;
      result.test_accuracy = accuracy;
      result.train_seconds = train_seconds;
      result.final_parameters = std::move(parameters);
    }
  };

  result.recorders = run_ranks(mesh, rank_main);
  return result;
}

} // namespace meshsim
