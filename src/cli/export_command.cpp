// `meshsim export RUN_DIR --state-dict FILE --hf DIR`: a run's trained model as a state_dict
// that PyTorch loads into its own definition of the model (train/export.h), and as a Hugging
// Face folder that transformers loads (train/hf_format.h). The model is gathered once for both.
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
#include "train/hf_format.h"

namespace meshsim {

void add_export_flags(CLI::App& app, ExportArgs& a) {
  app.add_option("run_dir", a.run_dir, "a run folder written by meshsim train")->required();
  app.add_option("--state-dict", a.state_dict,
                 "write the trained model here as a PyTorch state_dict (torch.load reads it)");
  app.add_option("--hf", a.hf,
                 "gpt/llama: write the trained model into this folder as Hugging Face's "
                 "config.json and model.safetensors (transformers' from_pretrained reads it)");
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

// --hf's folder: a folder, or a new name in a folder that takes one, checked before the
// checkpoint is read.
void check_hf_output(const std::string& path) {
  const PathKind kind = path_kind(path);
  if (kind == PathKind::kFile || kind == PathKind::kOther)
    throw std::invalid_argument(
        fmt::format("--hf {} {}; name a folder (made when missing)", printable(path),
                    kind == PathKind::kFile ? "is a file" : input_file_problem(path)));
  std::filesystem::path target(path);
  if (kind == PathKind::kNothing)
    target = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(target, ec))
    throw std::invalid_argument(fmt::format("--hf {}: its folder {} does not exist",
                                            printable(path), printable(target.string())));
  if (::access(target.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument(fmt::format("--hf {}: {} is not writable ({})", printable(path),
                                            printable(target.string()), std::strerror(errno)));
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
    if (args.state_dict.empty() && args.hf.empty())
      throw std::invalid_argument(
          "export needs --state-dict FILE (PyTorch) or --hf DIR (Hugging Face), or both");
    if (!args.state_dict.empty())
      check_output_file(args.state_dict);
    if (!args.hf.empty())
      check_hf_output(args.hf);
    const TrainConfig config = run_config(args.run_dir);
    if (!args.hf.empty() && hf_architecture(config.model).empty())
      throw std::invalid_argument(fmt::format(
          "--hf writes gpt and llama runs (GPT2LMHeadModel, LlamaForCausalLM); {} trains {}: "
          "export it with --state-dict",
          printable(args.run_dir), config.model));
    const ExportedModel model = export_model(config, args.run_dir);
    int64_t numbers = 0;
    for (const auto& entry : model.entries)
      numbers += entry.value.numel();
    if (!args.state_dict.empty()) {
      write_file_atomic(args.state_dict, state_dict_bytes(model));
      fmt::print(stderr, "meshsim: wrote {}: {}'s state_dict at step {}, {} tensors, {} parameters\n",
                 args.state_dict, config.model, model.step, model.entries.size(), numbers);
    }
    if (!args.hf.empty()) {
      const HfFolder folder = hf_folder(config, model);
      write_hf_folder(args.hf, folder);
      fmt::print(stderr,
                 "meshsim: wrote {}: {} as Hugging Face {} at step {} (config.json, "
                 "model.safetensors: {} tensors, {} parameters)\n",
                 args.hf, config.model, hf_architecture(config.model), model.step, folder.tensors,
                 numbers);
    }
    return kExitOk;
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

} // namespace meshsim
