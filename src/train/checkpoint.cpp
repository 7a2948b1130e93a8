// Checkpoint files.
#include "train/checkpoint.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "memory/allocator.h"
#include "models/models.h"
#include "report/atomic_file.h"

namespace meshsim {

void save_checkpoint(const std::filesystem::path& run_dir, torch::nn::Module& model,
                     const Optimizer* optimizer, const TrainPosition& position,
                     const torch::Tensor& dropout_rng) {
  const auto dir = run_dir / "checkpoint";
  std::filesystem::create_directories(dir);
  torch::serialize::OutputArchive archive;
  for (const auto& item : model.named_parameters()) archive.write("model/" + item.key(), item.value());
  archive.write("meta/step", torch::tensor(position.step));
  if (optimizer) optimizer->save(archive);
  if (dropout_rng.defined() && dropout_rng.numel() > 0) archive.write("rng/dropout", dropout_rng);
  const std::string name = fmt::format("step-{:08d}.pt", position.step);
  const auto tmp = dir / fmt::format(".{}.tmp-{}", name, ::getpid());
  archive.save_to(tmp.string());
  std::filesystem::rename(tmp, dir / name);
  write_file_atomic(dir / "latest", name + "\n");
}

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

TrainPosition load_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                              Optimizer* optimizer, torch::Tensor* dropout_rng) {
  const auto file = resolve_checkpoint(path);
  if (std::filesystem::is_directory(file))
    throw std::runtime_error("cannot resume from " + file.string() +
                             ": it holds one part per rank, written by a --tp/--pp/--zero run; "
                             "resume it with that run's layout");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(file.string());
    torch::NoGradGuard no_grad;
    for (auto& item : model.named_parameters()) {
      torch::Tensor t;  // fresh each time: read() into a defined tensor re-points it (set_)
      archive.read("model/" + item.key(), t);
      if (!t.sizes().equals(item.value().sizes()))
        throw std::runtime_error("parameter " + item.key() + " has another shape");
      item.value().copy_(t);
    }
    if (optimizer) optimizer->load(archive);
    if (dropout_rng && !archive.try_read("rng/dropout", *dropout_rng)) *dropout_rng = torch::Tensor();
    torch::Tensor step;
    archive.read("meta/step", step);
    return TrainPosition{step.item<int64_t>()};
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot resume from " + file.string() + ": " +
                             e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot resume from " + file.string() + ": " + e.what());
  }
}

void save_rank_checkpoint(const std::filesystem::path& run_dir, RankContext& ctx,
                          Strategy& strategy, const TrainPosition& position) {
  const auto dir = run_dir / "checkpoint";
  const std::string name = fmt::format("step-{:08d}", position.step);
  const auto tmp = dir / fmt::format(".{}.tmp-{}", name, ::getpid());
  const Group world = Group::world(ctx.world_size);
  if (ctx.rank == 0) {
    std::filesystem::remove_all(tmp);
    std::filesystem::create_directories(tmp);
  }
  ctx.comm.barrier(world);
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
  ctx.comm.barrier(world);  // every part is on disk
  if (ctx.rank == 0) {
    std::filesystem::remove_all(dir / name);  // an older checkpoint of the same step
    std::filesystem::rename(tmp, dir / name);
    write_file_atomic(dir / "latest", name + "\n");
  }
}

TrainPosition load_rank_checkpoint(const std::filesystem::path& path, RankContext& ctx,
                                   Strategy& strategy) {
  const auto folder = resolve_checkpoint(path);
  const auto file = folder / fmt::format("rank-{}.pt", ctx.rank);
  try {
    if (!std::filesystem::is_directory(folder))
      throw std::runtime_error("it holds the whole model of a run without --tp/--pp/--zero; "
                               "resume it with that run's layout");
    if (!std::filesystem::is_regular_file(file))
      throw std::runtime_error(fmt::format("no part for rank {} (the run had fewer GPUs?)", ctx.rank));
    GpuGuard host(nullptr);  // the archive's tensors are not GPU memory
    torch::serialize::InputArchive archive;
    archive.load_from(file.string());
    c10::IValue layout;
    archive.read("meta/layout", layout);
    if (layout.toStringRef() != strategy.checkpoint_layout())
      throw std::runtime_error(fmt::format("it was written by {}; this run is {}",
                                           layout.toStringRef(), strategy.checkpoint_layout()));
    strategy.load_state(archive);
    torch::Tensor rng;
    if (archive.try_read("rng/dropout", rng)) set_dropout_rng_state(*strategy.model(), rng);
    torch::Tensor step;
    archive.read("meta/step", step);
    return TrainPosition{step.item<int64_t>()};
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot resume from " + folder.string() + ": " +
                             e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot resume from " + folder.string() + ": " + e.what());
  }
}

} // namespace meshsim
