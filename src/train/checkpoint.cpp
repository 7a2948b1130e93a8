// Checkpoint files.
#include "train/checkpoint.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "report/atomic_file.h"

namespace meshsim {

void save_checkpoint(const std::filesystem::path& run_dir, torch::nn::Module& model,
                     const Optimizer* optimizer, const TrainPosition& position) {
  const auto dir = run_dir / "checkpoint";
  std::filesystem::create_directories(dir);
  torch::serialize::OutputArchive archive;
  for (const auto& item : model.named_parameters()) archive.write("model/" + item.key(), item.value());
  archive.write("meta/step", torch::tensor(position.step));
  if (optimizer) optimizer->save(archive);
  const std::string name = fmt::format("step-{:08d}.pt", position.step);
  const auto tmp = dir / fmt::format(".{}.tmp-{}", name, ::getpid());
  archive.save_to(tmp.string());
  std::filesystem::rename(tmp, dir / name);
  write_file_atomic(dir / "latest", name + "\n");
}

std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  if (std::filesystem::is_regular_file(path)) return path;
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
                              Optimizer* optimizer) {
  const auto file = resolve_checkpoint(path);
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

} // namespace meshsim
