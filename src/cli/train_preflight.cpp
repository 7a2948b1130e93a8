// The checks of `meshsim train` between validate and the mesh (cli/train_preflight.h): each
// prints its one-line refusal and gives the exit code.
#include "cli/train_preflight.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/bytes.h"
#include "cli/commands.h"
#include "memory/virtual_gpu.h"
#include "models/family.h"
#include "train/hf_format.h"
#include "train/trainer.h"

namespace meshsim {

// What a run refuses on this host before anything is allocated, after validate: a model whose
// float32 weights alone exceed the host's memory (it is built here, to count it, then on every
// rank), and synthetic data that would take more than half of it (a sample count past any
// tensor included). An exit code, or none to go on.
std::optional<int> refuse_too_large_for_host(const TrainConfig& config) {
  const ModelFamily& family = model_family(config.model);
  if (family.parameter_count) {
    const int64_t parameters = family.parameter_count(config.shape);
    const int64_t weight_bytes = 4 * parameters;
    const int64_t host = host_memory_for_gpus();
    if (weight_bytes > host) {
      fmt::print(stderr,
                 "meshsim: {} (--layers {}, --hidden {}, --vocab {}) has {} parameters: its "
                 "float32 weights ({}) exceed this machine's {} available; `meshsim plan` "
                 "predicts such a model without building it\n",
                 config.preset.empty() ? config.model : config.preset, config.shape.layers,
                 config.shape.hidden, config.shape.vocab, parameters, format_bytes(weight_bytes),
                 format_bytes(host));
      return kExitUsage;
    }
  }
  if (config.data == "synthetic") {
    const double sample_bytes = synthetic_sample_bytes(family, config.shape);
    const double samples =
        static_cast<double>(config.synthetic_train) + static_cast<double>(config.synthetic_test);
    const double host = static_cast<double>(host_memory_for_gpus());
    if (samples * sample_bytes > host / 2) {
      fmt::print(stderr,
                 "meshsim: {:.0f} synthetic {} take {}, more than half of this machine's {} "
                 "available; pass fewer with --synthetic-train ({}) and --synthetic-test ({})\n",
                 samples, sample_description(family, config.shape),
                 format_bytes(static_cast<int64_t>(std::min(samples * sample_bytes, 9e18))),
                 format_bytes(static_cast<int64_t>(host)), config.synthetic_train,
                 config.synthetic_test);
      return kExitUsage;
    }
  }
  return std::nullopt;
}

// Everything a resume needs is checked before the run folder is made: the checkpoint's
// manifest, its layout, every part's checksum, and that a step is left to train.
std::optional<int> verify_resume(const TrainConfig& config, const DataSplit& data,
                                 std::optional<VerifiedCheckpoint>& resume) {
  try {
    last_step(config, static_cast<int64_t>(data.train.size()));  // throws for a batch too small
    if (!config.resume.empty()) {
      resume = verify_checkpoint(config.resume, checkpoint_identity(config), config.gpus);
      check_steps_left(config, static_cast<int64_t>(data.train.size()), resume->manifest.step);
    } else if (!config.init_from.empty()) {
      check_hf_folder(config, config.init_from); // the weights are read once the ranks start
    }
  } catch (const std::exception& e) {
    // What is neither the data's nor the host's fault here is the flags': --resume names
    // something that is not a checkpoint of this run.
    Failure f = failure_of(e);
    if (f.code == kExitFailure) f.code = kExitUsage;
    fmt::print(stderr, "meshsim: {}\n", f.message);
    return f.code;
  }
  return std::nullopt;
}

// --backend c10d: this process is one rank of a run made of processes, placed by its
// environment.
std::optional<int> find_place(const TrainConfig& config, std::optional<ProcessPlace>& place) {
  if (config.backend != "c10d")
    return std::nullopt;
  try {
    place = place_from_environment();
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "meshsim: {}\n", e.what());
    return kExitUsage;
  }
  if (!place) {
    fmt::print(stderr, "meshsim: --backend c10d runs one rank per process and finds no RANK "
                       "and WORLD_SIZE: start it with `meshsim launch --nproc-per-node N -- "
                       "train ...`, torchrun, mpirun or srun\n");
    return kExitUsage;
  }
  return std::nullopt;
}

} // namespace meshsim
