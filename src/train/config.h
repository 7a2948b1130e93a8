// TrainConfig: everything a training run needs, resolved from flags and validated before
// anything starts. Saved as config.json so a run can be repeated.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "train/optimizer.h"

namespace meshsim {

constexpr const char* kDefaultData = "/usr/share/datasets/fashion-mnist";

struct TrainConfig {
  int gpus = 4;
  std::string strategy = "ddp";
  std::string model = "cnn";
  std::string data = kDefaultData;  // an IDX folder, or "synthetic"
  std::string device = "cpu";
  int64_t epochs = 1;
  int64_t max_steps = 0;      // 0: no limit
  int64_t batch_size = 64;    // per GPU
  uint64_t seed = 0;
  int64_t log_every = 10;
  OptimizerOptions optimizer;
  std::string gpu_mem = "auto";
  int64_t gpu_mem_bytes = 0;  // resolved from gpu_mem; 0 = auto
  double bucket_mb = 25;
  double comm_timeout_s = 60;
  int64_t checkpoint_every = 0;  // 0: only at the end
  std::string resume;
  std::string out;
  int64_t synthetic_train = 4096;
  int64_t synthetic_test = 1024;
  int64_t eval_limit = 0;  // 0: the whole test set
  std::string inject_fault;  // "RANK:STEP": that rank leaves the run at that step
  int fault_rank = -1;       // resolved from inject_fault by validate()
  int64_t fault_step = -1;
  bool progress = true;
  std::string cluster;  // --cluster: predict the run on this target cluster (cost/hardware.h)
  std::string intra;    // --intra / --inter: link overrides for --cluster
  std::string inter;
};

/// Checks every field; throws std::invalid_argument with a one-line message.
void validate(TrainConfig& config);

nlohmann::json to_json(const TrainConfig& config);

} // namespace meshsim
