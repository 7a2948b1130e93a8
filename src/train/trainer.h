// The training loop every strategy shares: sampler -> batch -> strategy step -> metrics,
// with evaluation at each epoch's end, checkpoints and progress.
#pragma once

#include <vector>

#include "data/dataset.h"
#include "mesh/device_mesh.h"
#include "mesh/recorder.h"
#include "report/run_folder.h"
#include "train/config.h"

namespace meshsim {

struct TrainResult {
  int64_t steps = 0;           // global step reached
  double final_loss = 0;       // loss of the last step
  double test_accuracy = 0;    // at the end
  double train_seconds = 0;    // the training steps alone
  std::vector<Recorder> recorders;
  std::vector<torch::Tensor> final_parameters;  // rank 0's, in model order
};

/// Trains on `mesh` as `config` says. `run` (may be null) receives metrics and checkpoints.
/// Rank threads' failures are rethrown here (OutOfMemory, CollectiveTimeout, ...).
TrainResult train(const TrainConfig& config, DeviceMesh& mesh, const DataSplit& data,
                  RunFolder* run);

} // namespace meshsim
