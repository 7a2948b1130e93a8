// RunFolder: the files of one run (see docs/run-folder.md). JSON files and memory.csv are
// written atomically; metrics.jsonl grows one whole line per write, so a run that dies
// keeps every line it logged.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "report/memory_picture.h"

namespace meshsim {

class TensorBoardWriter;

class RunFolder {
public:
  /// Creates `dir` (and its parents). An empty `dir` means runs/<timestamp>. Without `logs`
  /// (another process of the run keeps them: --backend c10d), metrics.jsonl and tb/ are
  /// neither opened nor written.
  explicit RunFolder(std::filesystem::path dir, bool logs = true);
  ~RunFolder();

  const std::filesystem::path& dir() const { return dir_; }

  void write_json(const std::string& name, const nlohmann::json& value) const;
  /// Appends one line to metrics.jsonl and one scalar per numeric field to tb/.
  void log_metrics(const nlohmann::json& line);
  /// One TensorBoard scalar (e.g. test accuracy), not a metrics.jsonl line.
  void log_scalar(const std::string& tag, double value, int64_t step);
  /// memory.csv and memory.png (report/memory_picture.h; a run that ended before its first
  /// step: the line of its setup). Returns false (with *error) if only the plot failed.
  bool write_memory(const MemoryPictureInput& picture, std::string* error) const;

private:
  std::filesystem::path dir_;
  std::mutex mutex_;
  int metrics_fd_ = -1;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

} // namespace meshsim
