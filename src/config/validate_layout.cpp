// validate's rules for the layout (config.cpp): dp × tp × pp, ZeRO, the pipeline's schedule,
// micro-batches and virtual stages, and the batch they divide; the model's own rules against
// the layout are validate_model.cpp's.
#include <algorithm>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "config/config.h"
#include "config/validation_steps.h"
#include "mesh/parallel_dims.h"
#include "models/models.h"
#include "parallel/pipeline/schedule.h"

namespace meshsim {
namespace {

// Megatron's --micro-batch-size m: micro-batches = global batch ÷ (m × dp). micro_batches 0
// means no count was asked for: 1, or the one m makes.
void resolve_micro_batches(TrainConfig& c, const ParallelDims& dims) {
  require(c.micro_batches >= 0,
          fmt::format("--micro-batches must be at least 1, got {}", c.micro_batches));
  if (c.micro_batch_size == 0) {
    c.micro_batches = std::max(c.micro_batches, 1);
    return;
  }
  const int64_t global = c.global_batch_size > 0 ? c.global_batch_size : c.batch_size * dims.dp;
  const int64_t per_step = c.micro_batch_size * dims.dp;
  require(global % per_step == 0,
          fmt::format("global batch {} is not divisible by --micro-batch-size {} × dp {} = {}",
                      global, c.micro_batch_size, dims.dp, per_step));
  const int64_t count = global / per_step;
  require(c.micro_batches == 0 || c.micro_batches == count,
          fmt::format("--micro-batches {} conflicts with --micro-batch-size {}: global batch {} ÷ "
                      "({} × dp {}) = {} micro-batches; give one of the two",
                      c.micro_batches, c.micro_batch_size, global, c.micro_batch_size, dims.dp,
                      count));
  require(count <= std::numeric_limits<int>::max(),
          fmt::format("--micro-batch-size {} makes {} micro-batches, more than {}",
                      c.micro_batch_size, count, std::numeric_limits<int>::max()));
  c.micro_batches = static_cast<int>(count);
}

} // namespace

void validate_layout(TrainConfig& c) {
  // Caught here because tp × pp would overflow an int in ParallelDims for sizes past --gpus.
  require(c.cp >= 1, fmt::format("--cp must be at least 1, got {}", c.cp));
  require(c.cp <= c.gpus, fmt::format("--gpus {} is not divisible by --cp {}", c.gpus, c.cp));
  require(c.tp < 1 || c.pp < 1 || (c.tp <= c.gpus && c.pp <= c.gpus),
          fmt::format("--gpus {} is not divisible by --tp {} × --pp {} = {}", c.gpus, c.tp, c.pp,
                      static_cast<int64_t>(c.tp) * c.pp));
  const ParallelDims dims = ParallelDims::make(c.gpus, c.tp, c.pp, c.cp);
  require(c.zero >= 0 && c.zero <= 3, fmt::format("--zero must be 0, 1, 2 or 3, got {}", c.zero));
  // Expert parallelism is carved out of the ranks that hold different data: dp × cp (with
  // HSDP, the dp_shard × cp ranks of one replica).
  require(c.ep >= 1, fmt::format("--ep must be at least 1, got {}", c.ep));
  const int64_t expert_span =
      int64_t{c.dp_shard > 0 ? c.dp_shard : dims.dp} * dims.cp;
  require(expert_span % c.ep == 0,
          fmt::format("--ep {} does not divide {} × --cp {} = {}", c.ep,
                      c.dp_shard > 0 ? fmt::format("--dp-shard {}", c.dp_shard)
                                     : fmt::format("dp {}", dims.dp),
                      dims.cp, expert_span));
  // HSDP shards ZeRO's state within groups of --dp-shard ranks: stage 1 its optimizer state,
  // 2 its gradients too, 3 its parameters too; without ZeRO nothing is sharded.
  require(c.dp_shard >= 0, fmt::format("--dp-shard must be at least 1, got {}", c.dp_shard));
  require(c.dp_shard == 0 || c.zero >= 1,
          fmt::format("--dp-shard {} shards ZeRO's state: it needs --zero 1, 2 or 3", c.dp_shard));
  require(c.dp_shard == 0 || dims.dp % c.dp_shard == 0,
          fmt::format("--dp-shard {} does not divide the {} data-parallel ranks", c.dp_shard,
                      dims.dp));
  require(!c.reduce_fp32 || c.zero >= 1,
          fmt::format("--reduce-fp32 is ZeRO's reduction of the gradients in fp32 (FSDP2's "
                      "reduce_dtype, Megatron's main_grad): it needs --zero 1, 2 or 3 (got "
                      "--zero {})",
                      c.zero));
  require(!c.reduce_fp32 || c.precision != "fp32",
          "--reduce-fp32 widens 16-bit gradients: it needs --precision bf16, fp16 or fp8");
  require(c.reshard_after_forward || c.zero == 3,
          "--no-reshard-after-forward keeps ZeRO-3's gathered parameters: it needs --zero 3");
  require(!c.distributed_optimizer || c.zero == 1,
          fmt::format("--distributed-optimizer is ZeRO 1 as Megatron-LM runs it: it needs --zero 1 "
                      "(got --zero {})",
                      c.zero));
  // The two copies of a tied embedding (first and last stage) sum their whole gradients after
  // the data-parallel reduction, which the distributed optimizer leaves in each shard only.
  require(!c.distributed_optimizer || c.pp == 1 || !c.shape.tie_head,
          "--distributed-optimizer with --pp needs an untied head (--no-tie-head): the tied "
          "embedding's two copies sum whole gradients, which it reduces shard by shard");
  require(listed(schedule_names(), c.schedule),
          fmt::format("unknown schedule '{}' (choose naive, gpipe or 1f1b)", c.schedule));
  resolve_micro_batches(c, dims);
  require(c.recompute == "none" || c.recompute == "selective" || c.recompute == "op" ||
              c.recompute == "full",
          fmt::format("unknown --recompute '{}' (choose none, selective, op or full)", c.recompute));
  require(c.recompute != "op" || c.tp == 1, kRecomputeOpNeedsTp1);
  require(c.virtual_stages >= 1,
          fmt::format("--virtual-stages must be at least 1, got {}", c.virtual_stages));
  require(c.virtual_stages == 1 || c.pp > 1,
          fmt::format("--virtual-stages {} needs --pp 2 or more: it interleaves the chunks of "
                      "several pipeline stages",
                      c.virtual_stages));
  require(c.virtual_stages == 1 || c.schedule == "1f1b",
          fmt::format("--virtual-stages {} runs with --schedule 1f1b (interleaved), not {}",
                      c.virtual_stages, c.schedule));
  require(c.virtual_stages == 1 || c.micro_batches % c.pp == 0,
          fmt::format("--micro-batches {} is not a multiple of --pp {}: the interleaved schedule "
                      "runs micro-batches in groups of pp",
                      c.micro_batches, c.pp));
  require(c.schedule != "naive" || c.micro_batches == 1,
          "--schedule naive runs the whole batch at once; use --micro-batches 1, or gpipe or 1f1b");
  require(!uses_mesh_layout(c) || c.strategy == "ddp",
          fmt::format("--tp, --pp, --cp, --ep, --zero, --micro-batches and --recompute run with --strategy ddp "
                      "(the default), not {}", c.strategy));
  require(c.cp_comm == "allgather" || c.cp_comm == "ring",
          fmt::format("unknown --cp-comm '{}' (choose allgather or ring)", c.cp_comm));
  require(c.loss_upcast || c.tp == 1,
          fmt::format("--no-loss-upcast runs with --tp 1 (got --tp {}): under tensor parallelism "
                      "the loss is Megatron's vocab-parallel cross-entropy, in fp32",
                      c.tp));
  require(c.moe_dispatch == "deepep" || c.moe_dispatch == "alltoall",
          fmt::format("unknown --moe-dispatch '{}' (choose deepep or alltoall)", c.moe_dispatch));
  require(!c.sequence_parallel || c.tp > 1,
          "--sequence-parallel needs --tp 2 or more: it splits the sequence over the tp group");
  require(!c.pp_scatter_gather || pipeline_messages_whole_on_tp(c),
          fmt::format("--pp-scatter-gather splits the pipeline's messages, which every tp rank "
                      "holds whole, over tp: it needs --tp 2 or more and --pp 2 or more without "
                      "--sequence-parallel (got --tp {}, --pp {}{})",
                      c.tp, c.pp, c.sequence_parallel ? ", --sequence-parallel" : ""));

  validate_model_layout(c);

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
  check_activation_sizes(c);
}

} // namespace meshsim
