// `meshsim export RUN_DIR --state-dict FILE`: a run's trained model as a state_dict that
// PyTorch loads into its own definition of the model (train/export.h).
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "cli/commands.h"
#include "data/dataset.h"
#include "report/atomic_file.h"
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
  const auto path = dir / "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::invalid_argument(
        fmt::format("{} is not a run folder: it has no config.json", dir.string()));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    throw DataError(fmt::format("{} is damaged: not valid JSON", path.string()));
  try {
    TrainConfig config = config_from_json(doc);
    config.device = "cpu"; // the export runs on the CPU, whatever trained the run
    validate(config);
    return config;
  } catch (const std::invalid_argument& e) {
    throw DataError(fmt::format("{} is damaged: {}", path.string(), e.what()));
  }
}

} // namespace

int run_export(const ExportArgs& args) {
  try {
    const TrainConfig config = run_config(args.run_dir);
    const ExportedModel model = export_model(config, args.run_dir);
    write_file_atomic(args.state_dict, state_dict_bytes(model));
    int64_t numbers = 0;
    for (const auto& entry : model.entries)
      numbers += entry.value.numel();
    fmt::print(stderr, "meshsim: wrote {}: {}'s state_dict at step {}, {} tensors, {} parameters\n",
               args.state_dict, config.model, model.step, model.entries.size(), numbers);
    return kExitOk;
  } catch (const DataError& e) {
    fmt::print(stderr, "meshsim: {}\n", one_line(e));
    return kExitData;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "meshsim: {}\n", one_line(e));
    return kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshsim: {}\n", one_line(e));
    return kExitFailure;
  }
}

} // namespace meshsim
