// Checkpoint files: a whole model on rank 0, or one part per rank.
#include "train/checkpoint.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "memory/allocator.h"
#include "models/models.h"
#include "report/atomic_file.h"

namespace meshsim {

std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path) || std::filesystem::is_regular_file(path / "rank-0.pt"))
    return path;
  std::filesystem::path dir = path;
  if (std::filesystem::is_directory(path / "checkpoint")) dir = path / "checkpoint";
  std::ifstream latest(dir / "latest");
  std::string name;
  if (!latest || !(latest >> name))
    throw std::runtime_error("no checkpoint to resume in " + path.string() +
                             " (expected checkpoint/latest)");
  return dir / name;
}

namespace {

// Runs `load` on the checkpoint `from`, turning its errors into one line that names it.
template <typename Load>
TrainPosition resuming_from(const std::filesystem::path& from, Load&& load) {
  try {
    return load();
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot resume from " + from.string() + ": " +
                             e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot resume from " + from.string() + ": " + e.what());
  }
}

TrainPosition read_position(torch::serialize::InputArchive& archive) {
  torch::Tensor step;
  archive.read("meta/step", step);
  return TrainPosition{step.item<int64_t>()};
}

// Rank 0 writes step-N.pt: the model, the optimizer and every rank's dropout generator
// states, one row per rank (gathered from every rank: a collective for models with dropout).
void save_whole(const std::filesystem::path& dir, RankContext& ctx, Strategy& strategy,
                const TrainPosition& position) {
  torch::Tensor dropout_rng = dropout_rng_state(*strategy.model());
  if (dropout_rng.numel() > 0) {
    CategoryScope scope(MemoryCategory::Communication);
    dropout_rng = ctx.comm.all_gather(dropout_rng, Group::world(ctx.world_size));
  }
  if (ctx.rank != 0) return;
  std::filesystem::create_directories(dir);
  torch::serialize::OutputArchive archive;
  for (const auto& item : strategy.model()->named_parameters())
    archive.write("model/" + item.key(), item.value());
  archive.write("meta/step", torch::tensor(position.step));
  if (const Optimizer* optimizer = strategy.optimizer()) optimizer->save(archive);
  if (dropout_rng.numel() > 0) archive.write("rng/dropout", dropout_rng);
  const std::string name = fmt::format("step-{:08d}.pt", position.step);
  const auto tmp = dir / fmt::format(".{}.tmp-{}", name, ::getpid());
  archive.save_to(tmp.string());
  std::filesystem::rename(tmp, dir / name);
  write_file_atomic(dir / "latest", name + "\n");
}

// Every rank writes its part to step-N/rank-R.pt.
void save_parts(const std::filesystem::path& dir, RankContext& ctx, Strategy& strategy,
                const TrainPosition& position) {
  const std::string name = fmt::format("step-{:08d}", position.step);
  const auto tmp = dir / fmt::format(".{}.tmp-{}", name, ::getpid());
  std::filesystem::create_directories(tmp);  // every rank: creating an existing folder is no error
  {
    GpuGuard host(nullptr);  // the archive's copies are not GPU memory
    torch::serialize::OutputArchive archive;
    archive.write("meta/step", torch::tensor(position.step));
    archive.write("meta/layout", c10::IValue(strategy.checkpoint_layout()));
    strategy.save_state(archive);
    const torch::Tensor rng = dropout_rng_state(*strategy.model());
    if (rng.numel() > 0) archive.write("rng/dropout", rng);
    archive.save_to((tmp / fmt::format("rank-{}.pt", ctx.rank)).string());
  }
  ctx.comm.barrier(Group::world(ctx.world_size));  // every part is on disk
  if (ctx.rank == 0) {
    std::filesystem::remove_all(dir / name);  // an older checkpoint of the same step
    std::filesystem::rename(tmp, dir / name);
    write_file_atomic(dir / "latest", name + "\n");
  }
}

TrainPosition load_whole(const std::filesystem::path& file, RankContext& ctx, Strategy& strategy) {
  if (std::filesystem::is_directory(file))
    throw std::runtime_error("it holds one part per rank, written by a --tp/--pp/--zero run; "
                             "resume it with that run's layout");
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  torch::NoGradGuard no_grad;
  for (auto& item : strategy.model()->named_parameters()) {
    torch::Tensor t;  // fresh each time: read() into a defined tensor re-points it (set_)
    archive.read("model/" + item.key(), t);
    if (!t.sizes().equals(item.value().sizes()))
      throw std::runtime_error("parameter " + item.key() + " has another shape");
    item.value().copy_(t);
  }
  if (Optimizer* optimizer = strategy.optimizer()) optimizer->load(archive);
  torch::Tensor rows;  // absent for a model without dropout
  if (archive.try_read("rng/dropout", rows)) {
    if (rows.size(0) == ctx.world_size)
      set_dropout_rng_state(*strategy.model(), rows[ctx.rank]);
    else if (ctx.rank == 0)
      fmt::print(stderr, "meshsim: warning: the checkpoint's dropout generators are for {} GPUs, "
                 "this run has {}: its dropout masks start afresh\n", rows.size(0), ctx.world_size);
  }
  return read_position(archive);
}

TrainPosition load_part(const std::filesystem::path& folder, RankContext& ctx, Strategy& strategy) {
  const auto file = folder / fmt::format("rank-{}.pt", ctx.rank);
  if (!std::filesystem::is_directory(folder))
    throw std::runtime_error("it holds the whole model of a run without --tp/--pp/--zero; "
                             "resume it with that run's layout");
  if (!std::filesystem::is_regular_file(file))
    throw std::runtime_error(fmt::format("no part for rank {} (the run had fewer GPUs?)", ctx.rank));
  GpuGuard host(nullptr);  // the archive's tensors are not GPU memory
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  c10::IValue written_by;
  archive.read("meta/layout", written_by);
  const std::string layout = strategy.checkpoint_layout();
  if (written_by.toStringRef() != layout)
    throw std::runtime_error(
        fmt::format("it was written by {}; this run is {}", written_by.toStringRef(), layout));
  strategy.load_state(archive);
  torch::Tensor rng;
  if (archive.try_read("rng/dropout", rng)) set_dropout_rng_state(*strategy.model(), rng);
  return read_position(archive);
}

} // namespace

void save_checkpoint(const std::filesystem::path& run_dir, RankContext& ctx, Strategy& strategy,
                     const TrainPosition& position) {
  const auto dir = run_dir / "checkpoint";
  if (strategy.checkpoints_per_rank())
    save_parts(dir, ctx, strategy, position);
  else
    save_whole(dir, ctx, strategy, position);
}

TrainPosition load_checkpoint(const std::filesystem::path& path, RankContext& ctx,
                              Strategy& strategy) {
  const auto at = resolve_checkpoint(path);
  return resuming_from(at, [&] {
    return strategy.checkpoints_per_rank() ? load_part(at, ctx, strategy)
                                           : load_whole(at, ctx, strategy);
  });
}

} // namespace meshsim
