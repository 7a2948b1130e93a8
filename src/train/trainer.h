// The training loop every strategy shares: sampler -> batch -> strategy step -> metrics,
// with evaluation at each epoch's end, checkpoints and progress.
#pragma once

#include <atomic>
#include <optional>
#include <vector>

#include "comm/recorder.h"
#include "data/dataset.h"
#include "mesh/device_mesh.h"
#include "parallel/strategy.h"
#include "report/routing.h"
#include "report/run_folder.h"
#include "train/checkpoint.h"
#include "config/config.h"
#include "config/strategy_options.h"
#include "train/stop.h"

namespace meshsim {

struct TrainResult {
  int64_t steps = 0;                     // global step reached
  double final_loss = 0;                 // loss of the last step
  double test_accuracy = 0;              // at the end (not evaluated when the run stopped early)
  int64_t test_samples = 0;              // how many test samples the accuracy is over
  double train_seconds = 0;              // the training steps alone
  StopReason stopped = StopReason::None; // why the run ended before its last step
  std::string stop_message;              // one line, when stopped
  std::vector<Recorder> recorders;
  std::vector<torch::Tensor> final_parameters; // rank 0's, in model order
  std::vector<int64_t> eval_peak_bytes;        // per GPU: the peak while evaluating
  std::vector<int64_t> model_state_bytes;      // per GPU: parameters + gradients + optimizer
                                               // held between steps (the most at any step end)
  std::vector<RoutingRecord> routing;          // a mixture of experts': every step, rank, layer
};

/// The training steps of one epoch over `train_samples`, as every rank counts them.
/// Throws std::invalid_argument when a replica's share cannot fill one step.
int64_t steps_per_epoch(const TrainConfig& config, int64_t train_samples);

/// The step a run of `config` ends at: --max-steps, or every epoch's steps.
int64_t last_step(const TrainConfig& config, int64_t train_samples);

/// Throws std::invalid_argument (one line) when a run resumed at `resume_step` has no step
/// left to train.
void check_steps_left(const TrainConfig& config, int64_t train_samples, int64_t resume_step);

/// Trains on `mesh` as `config` says. `run` (may be null) receives metrics and checkpoints.
/// `resume` is the checkpoint config.resume names, already verified; when it is empty and
/// config.resume is set, train verifies it first. Its bytes are released once loaded.
/// `stop_signal` (may be null) becomes non-zero when the run must stop early (a signal):
/// every rank then stops after the same step, and the run ends with what it has.
/// Rank threads' failures are rethrown here (OutOfMemory, CollectiveTimeout, ...).
TrainResult train(const TrainConfig& config, DeviceMesh& mesh, const DataSplit& data,
                  RunFolder* run, const std::atomic<int>* stop_signal = nullptr,
                  std::optional<VerifiedCheckpoint> resume = std::nullopt);

} // namespace meshsim
