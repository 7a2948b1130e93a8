// The run folder's writers.
#include "report/run_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <stdexcept>

#include "base/atomic_file.h"
#include "report/memory_picture.h"
#include "report/memory_report.h"
#include "report/tensorboard.h"

namespace meshsim {
namespace {

std::filesystem::path default_run_dir() {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  std::filesystem::path base = std::filesystem::path("runs") / stamp;
  std::filesystem::path dir = base;
  for (int i = 1; std::filesystem::exists(dir); ++i)
    dir = base.string() + "-" + std::to_string(i);
  return dir;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

} // namespace

RunFolder::RunFolder(std::filesystem::path dir, bool logs)
    : dir_(dir.empty() ? default_run_dir() : dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw std::runtime_error("cannot create run folder " + dir_.string() + ": " + ec.message());
  if (!logs) return;
  const auto metrics = dir_ / "metrics.jsonl";
  metrics_fd_ = ::open(metrics.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (metrics_fd_ < 0) throw std::runtime_error("cannot open " + metrics.string());
  tensorboard_ = std::make_unique<TensorBoardWriter>(dir_ / "tb");
}

RunFolder::~RunFolder() {
  if (metrics_fd_ >= 0) ::close(metrics_fd_);
  try {
    if (tensorboard_) tensorboard_->flush();
  } catch (...) {
  }
}

void RunFolder::write_json(const std::string& name, const nlohmann::json& value) const {
  write_file_atomic(dir_ / name, value.dump(2) + "\n");
}

void RunFolder::log_metrics(const nlohmann::json& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!tensorboard_) return;  // the logs are another process's
  const std::string text = line.dump() + "\n";
  // One write() per line: with O_APPEND a line is never split by a crash between writes.
  if (::write(metrics_fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    throw std::runtime_error("cannot write " + (dir_ / "metrics.jsonl").string());
  const int64_t step = line.value("step", int64_t{0});
  const double wall = unix_seconds();
  for (const auto& [key, v] : line.items())
    if (v.is_number() && key != "step" && key != "epoch")
      tensorboard_->add_scalar("train/" + key, v.get<float>(), step, wall);
  tensorboard_->flush();
}

void RunFolder::log_scalar(const std::string& tag, double value, int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!tensorboard_) return;
  tensorboard_->add_scalar(tag, static_cast<float>(value), step, unix_seconds());
  tensorboard_->flush();
}

bool RunFolder::write_memory(const MemoryPictureInput& picture, std::string* error) const {
  write_memory_csv(dir_ / "memory.csv", picture.samples,
                   static_cast<int>(picture.capacities.size()));
  // A run that ended before its first training step has only its setup to show: its line.
  if (picture_step(picture.samples) >= 0)
    return plot_memory_picture(dir_ / "memory.png", picture, error);
  return plot_memory(dir_ / "memory.png", picture.samples, picture.capacities, picture.title,
                     error);
}

} // namespace meshsim
