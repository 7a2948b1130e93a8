// `meshsim export RUN_DIR --state-dict FILE`: a run's trained model as a state_dict that
// PyTorch loads into its own definition of the model (train/export.h).
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/input_file.h"
#include "base/json_input.h"
#include "base/printable.h"
#include "cli/commands.h"
#include "data/dataset.h"
#include "base/atomic_file.h"
#include "train/export.h"

namespace meshsim {

void add_export_flags(CLI::App& app, ExportArgs& a) {
  app.add_option("run_dir", a.run_dir, "a run folder written by meshsim train")->required();
  app.add_option("--state-dict", a.state_dict,
                 "write the trained model here as a PyTorch state_dict (torch.load reads it)")
      ->required();
}

namespace {

// The run folder's config.json: what trained the checkpoint. Missing, it is not a run folder
// (std::invalid_argument); unreadable, a damaged one (DataError).
TrainConfig run_config(const std::filesystem::path& dir) {
  if (const std::string why = folder_problem(dir.string()); !why.empty())
    throw std::invalid_argument(
        fmt::format("{} is not a run folder: it {}", printable(dir.string()), why));
  const auto path = dir / "config.json";
  if (path_kind(path.string()) == PathKind::kNothing)
    throw std::invalid_argument(
        fmt::format("{} is not a run folder: it has no config.json", printable(dir.string())));
  nlohmann::json doc;
  try {
    doc = parse_json(read_input_file(path.string(), "config", kMaxConfigBytes), "");
  } catch (const JsonError& e) {
    throw DataError(fmt::format("{} is damaged{}", printable(path.string()), e.what()));
  }
  try {
    TrainConfig config = config_from_json(doc);
    config.device = "cpu"; // the export runs on the CPU, whatever trained the run
    validate(config);
    return config;
  } catch (const std::invalid_argument& e) {
    throw DataError(fmt::format("{} is damaged: {}", printable(path.string()), e.what()));
  }
}

// The state_dict's file: its folder must exist and take a new file, and the name must not be a
// folder, checked before the checkpoint is read.
void check_output_file(const std::string& path) {
  const std::filesystem::path target(path);
  std::error_code ec;
  const PathKind kind = path_kind(path);
  if (kind == PathKind::kFolder)
    throw std::invalid_argument(
        fmt::format("--state-dict {} is a folder; name the file to write", printable(path)));
  // A device, a FIFO or a link to nothing would be replaced by the file: never written over.
  if (kind == PathKind::kOther)
    throw std::invalid_argument(
        fmt::format("--state-dict {} {}; name a new or regular file", printable(path),
                    input_file_problem(path)));
  const std::filesystem::path parent =
      target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  if (!std::filesystem::is_directory(parent, ec))
    throw std::invalid_argument(fmt::format("--state-dict {}: its folder {} does not exist",
                                            printable(path), printable(parent.string())));
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument(fmt::format("--state-dict {}: its folder {} is not writable ({})",
                                            printable(path), printable(parent.string()),
                                            std::strerror(errno)));
}

} // namespace

int run_export(const ExportArgs& args) {
  try {
    check_output_file(args.state_dict);
    const TrainConfig config = run_config(args.run_dir);
    const ExportedModel model = export_model(config, args.run_dir);
    write_file_atomic(args.state_dict, state_dict_bytes(model));
    int64_t numbers = 0;
    for (const auto& entry : model.entries)
      numbers += entry.value.numel();
    fmt::print(stderr, "meshsim: wrote {}: {}'s state_dict at step {}, {} tensors, {} parameters\n",
               args.state_dict, config.model, model.step, model.entries.size(), numbers);
    return kExitOk;
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

} // namespace meshsim
