#include "config/strategy_options.h"

#include "config/stage_layers.h"
#include "cost/hardware.h"

namespace meshsim {

StrategyOptions strategy_options(const TrainConfig& config) {
  StrategyOptions options;
  options.model = config.model;
  options.seed = config.seed;
  options.optimizer = config.optimizer;
  options.bucket_mb = config.bucket_mb;
  options.overlap = config.overlap;
  options.shape = config.shape;
  options.shape.dropout = config.dropout;
  options.tp = config.tp;
  options.pp = config.pp;
  options.cp = config.cp;
  options.cp_comm = config.cp_comm;
  options.ep = config.ep;
  options.moe_dispatch = config.moe_dispatch;
  options.loss_upcast = config.loss_upcast;
  if (!config.cluster.empty()) // expert parallelism's exchange crosses nodes as they are
    options.node_size = parse_cluster_spec(config.cluster, config.intra, config.inter).gpus_per_node;
  options.sequence_parallel = config.sequence_parallel;
  options.pp_scatter_gather = config.pp_scatter_gather;
  options.zero = config.zero;
  options.dp_shard = config.dp_shard;
  options.reshard_after_forward = config.reshard_after_forward;
  options.reduce_fp32 = config.reduce_fp32;
  options.distributed_optimizer = config.distributed_optimizer;
  options.schedule = config.schedule;
  options.virtual_stages = config.virtual_stages;
  options.stage_layers = stage_layer_counts(config);
  options.micro_batches = config.micro_batches;
  options.recompute = parse_recompute(config.recompute);
  options.attention = parse_attention(config.attention);
  options.eager_elementwise = config.elementwise == "eager";
  // FP8 (plans only, config.cpp refuses it elsewhere): the model in bf16, with FP8 copies.
  options.fp8 = config.precision == "fp8";
  options.precision = options.fp8 ? "bf16" : config.precision;
  if (config.device == "cuda")
    options.device = torch::Device(torch::kCUDA, 0);
  return options;
}

} // namespace meshsim
