// What `meshsim train` checks after validate and before it makes a mesh or a run folder:
// what this host can hold, the checkpoint a resume names, and where a process of a run of
// processes stands. Each returns an exit code having printed why, or none to go on.
#pragma once

#include <optional>

#include "config/config.h"
#include "data/dataset.h"
#include "launch/process_env.h"
#include "train/checkpoint.h"

namespace meshsim {

/// A model whose float32 weights alone exceed the host's memory (it is built here, to count
/// it, then on every rank), and synthetic data that would take more than half of it (a sample
/// count past any tensor included), are refused before anything is allocated.
std::optional<int> refuse_too_large_for_host(const TrainConfig& config);

/// Everything a resume needs, checked before the run folder is made: a step left to train,
/// and for --resume the checkpoint's manifest, its layout and every part's checksum
/// (`resume` is set to it).
std::optional<int> verify_resume(const TrainConfig& config, const DataSplit& data,
                                 std::optional<VerifiedCheckpoint>& resume);

/// --backend c10d: this process is one rank of a run made of processes, placed by its
/// environment (`place` is set to it); nothing for --backend sim.
std::optional<int> find_place(const TrainConfig& config, std::optional<ProcessPlace>& place);

} // namespace meshsim
