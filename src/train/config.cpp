// Validation of TrainConfig: every bad value is a one-line error before anything runs.
#include "train/config.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "cost/hardware.h"
#include "memory/category.h"
#include "mesh/parallel_dims.h"
#include "models/models.h"
#include "parallel/pipeline.h"
#include "parallel/schedule.h"
#include "parallel/strategy.h"

namespace meshsim {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

void validate_layout(TrainConfig& c) {
  const ParallelDims dims = ParallelDims::make(c.gpus, c.tp, c.pp);
  require(c.zero >= 0 && c.zero <= 3, fmt::format("--zero must be 0, 1, 2 or 3, got {}", c.zero));
  require(contains(schedule_names(), c.schedule),
          fmt::format("unknown schedule '{}' (choose naive, gpipe or 1f1b)", c.schedule));
  require(c.micro_batches >= 1, fmt::format("--micro-batches must be at least 1, got {}", c.micro_batches));
  require(c.recompute == "none" || c.recompute == "full",
          fmt::format("unknown --recompute '{}' (choose none or full)", c.recompute));
  require(c.schedule != "naive" || c.micro_batches == 1,
          "--schedule naive runs the whole batch at once; use --micro-batches 1, or gpipe or 1f1b");
  require(!uses_mesh_layout(c) || c.strategy == "ddp",
          fmt::format("--tp, --pp, --zero, --micro-batches and --recompute run with --strategy ddp "
                      "(the default), not {}", c.strategy));
  require(c.zero <= 1 || (c.tp == 1 && c.pp == 1),
          fmt::format("--zero {} runs with data parallelism alone so far; use --zero 1 with --tp or --pp",
                      c.zero));

  if (c.model == "gpt") {
    const auto& g = c.gpt;
    require(g.layers >= 1 && g.hidden >= 1 && g.heads >= 1 && g.seq_len >= 1 && g.vocab >= 1,
            "--layers, --hidden, --heads, --seq-len and --vocab must be positive");
    require(g.hidden % g.heads == 0,
            fmt::format("--hidden {} is not divisible by --heads {}", g.hidden, g.heads));
    require(g.heads % c.tp == 0,
            fmt::format("--heads {} is not divisible by --tp {}", g.heads, c.tp));
    require(g.layers >= c.pp,
            fmt::format("--layers {} is fewer than --pp {}: every stage needs a layer", g.layers, c.pp));
    require(!g.tie_head || c.pp == 1,
            "--tie-head needs --pp 1: the embedding and the head would be on different stages");
    require(c.data == "synthetic" || g.vocab >= 256,
            fmt::format("--vocab {} is too small for byte-level text (256 byte values)", g.vocab));
  } else {
    require(c.tp == 1, "--tp needs --model gpt: its plan splits attention and the MLP");
    require(c.recompute == "none", "--recompute applies to the transformer blocks of --model gpt");
    const int units = pipeline_units(build_model(c.model, {}));
    require(c.pp <= units, fmt::format("--pp {} is more than {}'s {} layers with parameters", c.pp,
                                       c.model, units));
  }

  const int64_t per_step = static_cast<int64_t>(dims.dp) * c.micro_batches;
  if (c.global_batch_size > 0) {
    require(c.global_batch_size % per_step == 0,
            fmt::format("global batch {} is not divisible by dp {} × micro-batches {} = {}",
                        c.global_batch_size, dims.dp, c.micro_batches, per_step));
    c.batch_size = c.global_batch_size / dims.dp;
  } else {
    require(c.batch_size % c.micro_batches == 0,
            fmt::format("global batch {} (--batch-size {} × dp {}) is not divisible by dp {} × "
                        "micro-batches {} = {}",
                        c.batch_size * dims.dp, c.batch_size, dims.dp, dims.dp, c.micro_batches,
                        per_step));
  }
}

} // namespace

bool uses_mesh_layout(const TrainConfig& c) {
  return c.tp > 1 || c.pp > 1 || c.zero > 0 || c.micro_batches > 1 || c.recompute != "none";
}

void validate(TrainConfig& c) {
  require(c.gpus >= 1 && c.gpus <= 1024, fmt::format("--gpus must be between 1 and 1024, got {}", c.gpus));
  require(contains(strategy_names(), c.strategy),
          fmt::format("unknown strategy '{}' (choose single, ddp or dp)", c.strategy));
  require(contains(model_names(), c.model),
          fmt::format("unknown model '{}' (choose cnn, lenet or gpt)", c.model));
  require(c.strategy != "single" || c.gpus == 1, "--strategy single runs on one GPU; use --gpus 1");
  require(c.device == "cpu" || c.device.rfind("cuda", 0) == 0,
          fmt::format("unknown device '{}' (choose cpu or cuda)", c.device));
  require(c.device == "cpu",
          "--device cuda: this build of meshsim attributes memory on the CPU device only");
  require(c.batch_size >= 1, fmt::format("--batch-size must be at least 1, got {}", c.batch_size));
  require(c.epochs >= 1, fmt::format("--epochs must be at least 1, got {}", c.epochs));
  require(c.max_steps >= 0, "--max-steps must be 0 (no limit) or more");
  require(c.log_every >= 1, "--log-every must be at least 1");
  require(c.optimizer.name == "adam" || c.optimizer.name == "sgd",
          fmt::format("unknown optimizer '{}' (choose adam or sgd)", c.optimizer.name));
  require(c.optimizer.lr > 0, "--lr must be positive");
  require(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1, "--momentum must be in [0, 1)");
  require(c.bucket_mb > 0, "--bucket-mb must be positive");
  require(c.comm_timeout_s > 0, "--comm-timeout must be positive");
  require(c.checkpoint_every >= 0, "--checkpoint-every must be 0 or more");
  require(c.eval_limit >= 0, "--eval-limit must be 0 (all) or more");
  require(c.synthetic_train >= 1 && c.synthetic_test >= 1, "synthetic sizes must be positive");
  if (c.data.empty()) c.data = c.model == "gpt" ? kDefaultText : kDefaultData;
  validate_layout(c);
  if (c.gpu_mem == "auto") {
    c.gpu_mem_bytes = 0;
  } else {
    try {
      c.gpu_mem_bytes = parse_bytes(c.gpu_mem);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("--gpu-mem: {}", e.what()));
    }
  }
  if (!c.inject_fault.empty()) {
    int rank = -1;
    long long step = -1;
    char extra = 0;
    require(std::sscanf(c.inject_fault.c_str(), "%d:%lld%c", &rank, &step, &extra) == 2 &&
                rank >= 0 && rank < c.gpus && step >= 1,
            fmt::format("--inject-fault expects RANK:STEP with 0 <= RANK < {}, got '{}'", c.gpus,
                        c.inject_fault));
    require(c.strategy == "ddp", "--inject-fault is supported with --strategy ddp");
    c.fault_rank = rank;
    c.fault_step = step;
  }
  require(c.cluster.empty() ? c.intra.empty() && c.inter.empty() : true,
          "--intra and --inter need --cluster");
  if (!c.cluster.empty()) {
    const ClusterSpec cluster = parse_cluster_spec(c.cluster, c.intra, c.inter);  // throws
    require(cluster.world_size() >= c.gpus,
            fmt::format("--cluster {} has {} GPUs, fewer than --gpus {}", c.cluster,
                        cluster.world_size(), c.gpus));
  }
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"gpus", c.gpus},
          {"strategy", c.strategy},
          {"model", c.model},
          {"data", c.data},
          {"device", c.device},
          {"epochs", c.epochs},
          {"max_steps", c.max_steps},
          {"batch_size", c.batch_size},
          {"global_batch_size", c.batch_size * (c.gpus / (c.tp * c.pp))},
          {"tp", c.tp},
          {"pp", c.pp},
          {"dp", c.gpus / (c.tp * c.pp)},
          {"zero", c.zero},
          {"schedule", c.schedule},
          {"micro_batches", c.micro_batches},
          {"recompute", c.recompute},
          {"gpt",
           {{"layers", c.gpt.layers},
            {"hidden", c.gpt.hidden},
            {"heads", c.gpt.heads},
            {"seq_len", c.gpt.seq_len},
            {"vocab", c.gpt.vocab},
            {"tie_head", c.gpt.tie_head}}},
          {"seed", c.seed},
          {"log_every", c.log_every},
          {"optimizer", c.optimizer.name},
          {"lr", c.optimizer.lr},
          {"momentum", c.optimizer.momentum},
          {"gpu_mem", c.gpu_mem},
          {"bucket_mb", c.bucket_mb},
          {"comm_timeout_s", c.comm_timeout_s},
          {"checkpoint_every", c.checkpoint_every},
          {"resume", c.resume},
          {"synthetic_train", c.synthetic_train},
          {"synthetic_test", c.synthetic_test},
          {"eval_limit", c.eval_limit},
          {"cluster", c.cluster},
          {"intra", c.intra},
          {"inter", c.inter}};
}

} // namespace meshsim
