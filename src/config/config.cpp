// Validation of TrainConfig: every bad value is a one-line error before anything runs. The
// general flags are checked here; the model's rules (validate_model.cpp) and the layout's
// (validate_layout.cpp) are steps of their own, and config.json is json.cpp's.
#include "config/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>

#include "base/printable.h"
#include "comm/c10d_backend.h"
#include "config/byte_size.h"
#include "config/validation_steps.h"
#include "cost/hardware.h"
#include "device/physical_device.h"
#include "mesh/parallel_dims.h"
#include "parallel/strategy.h"

namespace meshsim {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

ParallelDims layout_dims(const TrainConfig& c) {
  ParallelSizes sizes;
  sizes.world = c.gpus;
  sizes.tp = c.tp;
  sizes.pp = c.pp;
  sizes.cp = c.cp;
  sizes.dp_shard = c.dp_shard;
  sizes.ep = c.ep;
  return ParallelDims::make(sizes);
}

bool uses_mesh_layout(const TrainConfig& c) {
  return c.tp > 1 || c.pp > 1 || c.zero > 0 || c.micro_batches > 1 || c.recompute != "none" ||
         c.cp > 1 || c.ep > 1;
}

bool pipeline_messages_whole_on_tp(const TrainConfig& c) {
  return c.tp > 1 && c.pp > 1 && !c.sequence_parallel;
}

namespace {

// --inject-fault RANK:STEP, each part checked on its own so the message names the wrong one.
void parse_fault(TrainConfig& c) {
  const std::string& text = c.inject_fault;
  const auto colon = text.find(':');
  int rank = -1;
  long long step = -1;
  char extra = 0;
  require(colon != std::string::npos &&
              std::sscanf(text.substr(0, colon).c_str(), "%d%c", &rank, &extra) == 1 &&
              std::sscanf(text.substr(colon + 1).c_str(), "%lld%c", &step, &extra) == 1,
          fmt::format("--inject-fault expects RANK:STEP (two integers), got '{}'", text));
  require(c.gpus >= 2, "--inject-fault needs at least 2 GPUs: a rank that leaves needs others to notice");
  require(rank >= 0 && rank < c.gpus,
          fmt::format("--inject-fault {}: RANK {} is not a rank of --gpus {} (0 to {})", text, rank,
                      c.gpus, c.gpus - 1));
  require(step >= 1, fmt::format("--inject-fault {}: STEP must be at least 1 (steps count from 1), "
                                 "got {}", text, step));
  c.fault_rank = rank;
  c.fault_step = step;
}

// A text value with a control character (a flag given $'dd\rp', a config.json's "\u0000"):
// refused first, naming it printably, so that no message below quotes it raw.
void check_texts_printable(const TrainConfig& c) {
  const std::pair<const char*, const std::string*> texts[] = {
      {"--strategy", &c.strategy},   {"--model", &c.model},         {"--preset", &c.preset},
      {"--data", &c.data},           {"--device", &c.device},       {"--schedule", &c.schedule},
      {"--recompute", &c.recompute}, {"--precision", &c.precision}, {"--optimizer", &c.optimizer.name},
      {"--gpu-mem", &c.gpu_mem},     {"--backend", &c.backend},     {"--resume", &c.resume},
      {"--init-from", &c.init_from}, {"--out", &c.out},             {"--cluster", &c.cluster},
      {"--intra", &c.intra},         {"--inter", &c.inter},         {"--inject-fault", &c.inject_fault},
      {"--attention", &c.attention}, {"--hf-config", &c.hf_config},
      {"--elementwise", &c.elementwise}};
  for (const auto& [flag, text] : texts)
    require(!has_control_character(*text),
            fmt::format("{} '{}' holds a control character", flag, printable(*text)));
}

} // namespace

void validate(TrainConfig& c) {
  check_texts_printable(c);
  const int max_gpus = c.device == "meta" ? kMaxPlannedGpus : kMaxGpus;
  require(c.gpus >= 1 && c.gpus <= max_gpus,
          fmt::format("--gpus must be between 1 and {}, got {}", max_gpus, c.gpus));
  require(listed(strategy_names(), c.strategy),
          fmt::format("unknown strategy '{}' (choose single, ddp or dp)", c.strategy));
  check_model_name(c);
  require(c.strategy != "single" || c.gpus == 1,
          fmt::format("--strategy single runs on one GPU; use --gpus 1, not {}", c.gpus));
  // "meta" is set by meshsim plan (shapes without data), never by a flag (train_flags.cpp).
  require(c.device == "cpu" || c.device == "cuda" || c.device == "cuda:0" || c.device == "auto" ||
              c.device == "meta",
          fmt::format("unknown device '{}' (choose cpu, cuda or auto)", c.device));
  require(c.backend == "sim" || c.backend == "c10d",
          fmt::format("unknown --backend '{}' (choose sim or c10d)", c.backend));
  if (c.backend == "c10d") {
    // One process per rank: on the host's cores through Gloo, or on a card of its own through
    // NCCL where this LibTorch has it. Auto keeps to the CPU: NCCL is asked for by name.
    if (c.device == "auto")
      c.device = "cpu";
    const std::string why = c10d_device_refusal(c.device);
    require(why.empty(), why);
    require(!c.memory_snapshot, "--memory-snapshot records the virtual GPUs of one process: use "
                                "it with --backend sim");
  }
  const bool chose_cuda = c.device != "auto"; // auto picks the card only when it is usable
  if (c.device != "meta")
    c.device = resolve_device(c.device);
  if (c.device == "cuda" && chose_cuda) {
    const CudaStatus card = cuda_status();
    require(card.usable, "--device cuda: " + card.reason);
  }
  // The caps keep batch × dp (× micro-batches) far from int64 overflow.
  require(c.batch_size >= 1 && c.batch_size <= kMaxBatchSize,
          fmt::format("--batch-size must be between 1 and {}, got {}", kMaxBatchSize, c.batch_size));
  require(c.global_batch_size >= 0 && c.global_batch_size <= kMaxBatchSize,
          fmt::format("--global-batch-size must be between 1 and {}, got {}", kMaxBatchSize,
                      c.global_batch_size));
  require(c.micro_batch_size >= 0 && c.micro_batch_size <= kMaxBatchSize,
          fmt::format("--micro-batch-size must be between 1 and {}, got {}", kMaxBatchSize,
                      c.micro_batch_size));
  require(c.epochs >= 1, fmt::format("--epochs must be at least 1, got {}", c.epochs));
  require(c.max_steps >= 0, fmt::format("--max-steps must be 0 (no limit) or more, got {}", c.max_steps));
  require(c.log_every >= 1, fmt::format("--log-every must be at least 1, got {}", c.log_every));
  require(c.precision == "fp32" || c.precision == "bf16" || c.precision == "fp16" ||
              c.precision == "fp8",
          fmt::format("unknown --precision '{}' (choose fp32, bf16, fp16, or fp8 in a plan)",
                      printable(c.precision)));
  // FP8 GEMMs need FP8 tensor cores: the CPU has none, and LibTorch 1.13 has no float8 type.
  require(c.precision != "fp8" || c.device == "meta",
          "--precision fp8 is for meshsim plan (FP8 GEMMs need a GPU's FP8 tensor cores; a run "
          "trains in fp32, bf16 or fp16)");
  // LibTorch 1.13's CPU kernels have no fp16 matmul, convolution or layer norm (addmm,
  // slow_conv2d and LayerNormKernelImpl are "not implemented for 'Half'"); bf16 has them all.
  require(c.precision != "fp16" || c.device != "cpu",
          "--precision fp16 cannot train on the CPU (LibTorch 1.13 has no fp16 CPU matmul); use bf16");
  require(c.optimizer.name == "adam" || c.optimizer.name == "sgd",
          fmt::format("unknown optimizer '{}' (choose adam or sgd)", c.optimizer.name));
  // 0 is allowed: the weights then stay as they start, and the run measures their loss.
  require(std::isfinite(c.optimizer.lr) && c.optimizer.lr >= 0,
          fmt::format("--lr must be a finite number of at least 0, got {}", c.optimizer.lr));
  require(c.dropout >= 0 && c.dropout < 1,
          fmt::format("--dropout must be in [0, 1), got {}", c.dropout));
  require(c.dropout == 0 || c.strategy != "dp",
          "--dropout runs with --strategy single or ddp (dp's scatter does not give its rows' "
          "places in the global batch)");
  require(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1,
          fmt::format("--momentum must be in [0, 1), got {}", c.optimizer.momentum));
  require(std::isfinite(c.bucket_mb) && c.bucket_mb > 0 && c.bucket_mb <= kMaxBucketMb,
          fmt::format("--bucket-mb must be a positive number up to {}, got {}", kMaxBucketMb,
                      c.bucket_mb));
  // Past a week a timeout means "never"; it would also overflow the clock's arithmetic.
  require(std::isfinite(c.comm_timeout_s) && c.comm_timeout_s >= 0.001 &&
              c.comm_timeout_s <= kMaxCommTimeoutS,
          fmt::format("--comm-timeout must be between 0.001 and {} seconds, got {}",
                      kMaxCommTimeoutS, c.comm_timeout_s));
  require(c.checkpoint_every >= 0,
          fmt::format("--checkpoint-every must be 0 or more, got {}", c.checkpoint_every));
  require(c.keep_checkpoints >= 0,
          fmt::format("--keep-checkpoints must be 0 (keep all) or more, got {}", c.keep_checkpoints));
  require(c.eval_limit >= 0, fmt::format("--eval-limit must be 0 (all) or more, got {}", c.eval_limit));
  require(c.synthetic_train >= 1 && c.synthetic_test >= 1,
          fmt::format("--synthetic-train and --synthetic-test must be positive, got {} and {}",
                      c.synthetic_train, c.synthetic_test));
  resolve_model_data(c);
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
  if (!c.inject_fault.empty()) parse_fault(c);
  require(c.cluster.empty() ? c.intra.empty() && c.inter.empty() : true,
          "--intra and --inter need --cluster");
  if (!c.cluster.empty()) {
    const ClusterSpec cluster = parse_cluster_spec(c.cluster, c.intra, c.inter);  // throws
    require(cluster.world_size() >= c.gpus,
            fmt::format("--cluster {} has {} GPUs, fewer than --gpus {}", c.cluster,
                        cluster.world_size(), c.gpus));
  }
}

} // namespace meshsim
