// TrainConfig: everything a training run needs, resolved from flags and validated before
// anything starts. Saved as config.json so a run can be repeated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/family.h"
#include "models/models.h"
#include "optim/optimizer.h"

namespace meshsim {

struct ParallelDims;

/// Limits of the flags: what this process can hold, and what its clock can count.
constexpr int kMaxGpus = 1024;
/// A plan runs on the meta device and executes one GPU per symmetry class: it may cover the
/// largest clusters built.
constexpr int kMaxPlannedGpus = 100000;
constexpr double kMaxCommTimeoutS = 7 * 24 * 3600.0;
constexpr double kMaxBucketMb = 1 << 20;
constexpr int64_t kMaxBatchSize = int64_t{1} << 40;

struct TrainConfig {
  int gpus = 4;
  std::string strategy = "ddp";
  std::string model = "cnn";
  std::string data;           // an IDX folder, a text file (gpt), or "synthetic"; "" = the model's default
  std::string preset;         // --preset NAME (or a preset name as --model): the shape started from
  std::string hf_config;      // --hf-config FILE: the Hugging Face config.json the shape came from
  TransformerShape shape;             // --layers --hidden --heads --kv-heads --ffn-hidden --seq-len --vocab
                              // --tie-head --rope-theta (gpt and llama)
  int tp = 1, pp = 1;         // dp = gpus / (tp · pp · cp)
  int cp = 1;                 // context parallel: each rank holds 2 of 2·cp chunks of the sequence
  std::string cp_comm = "allgather";  // how cp brings K/V: allgather | ring
  int ep = 1;                 // expert parallel: the routed experts over ep ranks of dp × cp
  std::string moe_dispatch = "deepep"; // how ep exchanges tokens: deepep | alltoall
  int zero = 0;
  int dp_shard = 0;             // --dp-shard N: HSDP, ZeRO shards within N dp ranks; 0: all of dp
  bool reshard_after_forward = true;  // --no-reshard-after-forward: ZeRO 3 keeps blocks gathered
  bool reduce_fp32 = false;           // --reduce-fp32: ZeRO 1/2/3 reduce 16-bit grads in fp32
  bool distributed_optimizer = false; // --distributed-optimizer: ZeRO 1 as Megatron's (zero.h)
  std::string schedule = "1f1b";
  int virtual_stages = 1;       // model chunks per pipeline stage: interleaved 1F1B when > 1
  int first_stage_layers = 0;   // transformer blocks on the first / last pipeline stage; 0: even
  int last_stage_layers = 0;    // (the other stages share the rest evenly: config/stage_layers.h)
  std::string stage_layers;     // "3,4,4,3": blocks of every stage (pp × virtual stages counts)
  int micro_batches = 0;        // 0: not given: 1, or what micro_batch_size makes (validate)
  int64_t micro_batch_size = 0; // samples per micro-batch; 0: batch ÷ micro_batches
  std::string recompute = "none";
  std::string attention = "fused"; // fused | eager: the attention core (gpt, llama)
  /// fused | eager: how predictions count the blocks' elementwise steps (RMSNorm, the rotation
  /// of q and k): one kernel each, as torch.compile and Transformer Engine run them, or op by
  /// op, as PyTorch runs them without torch.compile (flops.h).
  std::string elementwise = "fused";
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (mixed precision: optim/optimizer.h)
  /// The cross-entropy casts 16-bit logits to fp32 first (PyTorch's and Megatron's way);
  /// --no-loss-upcast: in the logits' own precision (NeMo AutoModel's fp32_upcast: false).
  bool loss_upcast = true;
  bool sequence_parallel = false;  // with tp > 1: norms and residuals on 1/tp of the sequence
  /// --pp-scatter-gather (tp > 1, pp > 1, no sequence parallel): each tp rank sends 1/tp of a
  /// stage's output and of its gradient, all-gathered over tp on arrival (Megatron-LM 2021's)
  bool pp_scatter_gather = false;
  /// --dropout P (gpt, llama): on the attention probabilities and the attention's and MLP's
  /// outputs in training, masks the same on every layout (models/layers/dropout.h); 0: none
  double dropout = 0;
  int64_t global_batch_size = 0;  // 0: batch_size × dp (a flag value must be positive)
  std::string device = "cpu";
  /// sim: every GPU a thread of this process; c10d: one rank per process, started by
  /// `meshsim launch`, torchrun, mpirun or srun (docs/processes.md)
  std::string backend = "sim";
  int64_t epochs = 1;
  int64_t max_steps = 0;      // 0: no limit
  int64_t batch_size = 64;    // per data-parallel replica (per GPU without --tp/--pp)
  uint64_t seed = 0;
  int64_t log_every = 10;
  OptimizerOptions optimizer;
  std::string gpu_mem = "auto";
  int64_t gpu_mem_bytes = 0;  // resolved from gpu_mem; 0 = auto
  double bucket_mb = 25;
  bool overlap = true;  // --no-overlap: ddp all-reduces its buckets after backward
  bool tp_comm_overlap = false;  // --tp-comm-overlap: a plan's tp collectives beside its GEMMs
  double comm_timeout_s = 60;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t keep_checkpoints = 0;  // the newest N checkpoints are kept; 0: all
  std::string resume;
  /// A Hugging Face folder (config.json, model.safetensors) whose weights the run starts from
  /// instead of the seed's (gpt, llama; train/hf_format.h). A resume's checkpoint wins over it.
  std::string init_from;
  std::string out;
  int64_t synthetic_train = 4096;
  int64_t synthetic_test = 1024;
  int64_t eval_limit = 0;  // 0: the whole test set
  std::string inject_fault;  // "RANK:STEP": that rank leaves the run at that step
  int fault_rank = -1;       // resolved from inject_fault by validate()
  int64_t fault_step = -1;
  bool progress = true;
  bool memory_snapshot = false;  // memory_snapshot/gpuN.pickle: the last steps' allocations
  std::string cluster;  // --cluster: predict the run on this target cluster (cost/hardware.h)
  std::string intra;    // --intra / --inter: link overrides for --cluster
  std::string inter;
};

/// Throws std::invalid_argument(message) unless `ok`: a flag's one-line error.
void require(bool ok, const std::string& message);

/// Which of the flags that name a model were given on the command line: a preset applies its
/// shape only when named there (a preset read from --config is a label of the file's shape).
struct ModelFlagsGiven {
  bool model = false;  // --model
  bool preset = false; // --preset
  /// The shape flags given, by name ("--layers", ...): they override the preset's values.
  std::vector<std::string> shape;
};

/// The flags that set a field of the shape (TransformerShape), each of which overrides a preset.
const std::vector<std::string>& shape_flag_names();

/// Applies --preset, or a preset named by --model, to `config`: model becomes the preset's
/// family ("gpt" or "llama") and every field of the shape takes the preset's value unless its
/// flag was given. Does nothing when neither flag names a preset. Throws std::invalid_argument
/// (one line) for an unknown preset, two different presets, or --model of another family.
void apply_preset(TrainConfig& config, const ModelFlagsGiven& given);

/// Applies --hf-config: reads config.hf_config (a config.json, or a folder holding one;
/// models/hf_config.h), sets model to its family and the shape to the file's, except the
/// fields whose flags were given, which override it as they override a preset. Throws
/// std::invalid_argument (one line) for --preset or another model beside it, or a file meshsim
/// cannot build; DataError or JsonError for a file it cannot read as JSON.
void apply_hf_config(TrainConfig& config, const ModelFlagsGiven& given);

/// Checks a transformer's shape for `family` ("gpt" or "llama"): every size positive (kv_heads
/// and ffn_hidden may be 0, the family's default), heads divide hidden, kv heads divide heads
/// (gpt has no grouped-query attention), a finite positive rope theta, and a parameter count
/// within kMaxParameters. Throws std::invalid_argument with a one-line message naming the flag.
void validate_shape(const std::string& family, const TransformerShape& shape);

/// The three preset names nearest to `name` (edit distance), for messages about a typo.
std::string nearest_preset_names(const std::string& name);

/// "unknown preset 'NAME' (nearest: ...; `meshsim models` lists them all)".
std::string unknown_preset_message(const std::string& name);

/// The largest model meshsim accepts: 16 bytes of model state per parameter (fp32 Adam, or
/// mixed precision's 2 + 2 + 12) must stay far inside int64 bytes, and a thousand times the
/// largest preset (1.0e12) leaves room for any real model.
constexpr double kMaxParameters = 1e15;

/// The most numbers one activation may hold: 2^59, so that its bytes (8 a number at most) stay
/// inside LibTorch's int64 storage size with room to spare.
constexpr double kMaxTensorNumbers = 576460752303423488.0;

/// Whether the run needs the hybrid dp × tp × pp engine (any of --tp --pp --zero
/// --micro-batches --recompute).
bool uses_mesh_layout(const TrainConfig& config);

/// Whether every tp rank of a pipeline stage holds the stage's messages whole (tp and pp of 2 or
/// more, no sequence parallelism), so that --pp-scatter-gather can split them over tp.
bool pipeline_messages_whole_on_tp(const TrainConfig& config);

/// The run's named dimensions (mesh/parallel_dims.h): --gpus, --tp, --pp and --dp-shard.
/// Throws std::invalid_argument as ParallelDims::make does.
ParallelDims layout_dims(const TrainConfig& config);

/// Checks every field and resolves the derived ones (data default, batch per replica, the
/// fault); throws std::invalid_argument with a one-line message.
void validate(TrainConfig& config);

nlohmann::json to_json(const TrainConfig& config);

/// What every process of a run with --backend c10d must agree on before it trains: config.json's
/// fields (model, layout, optimizer, steps, data, ...) and the run folder, --out
/// (config_fingerprint.cpp).
nlohmann::json configuration_fingerprint(const TrainConfig& config);

/// The first field, in sorted key order ("gpt.hidden" for a nested one), whose value differs
/// between two fingerprints, with its value in each (JSON text, printable); none when equal.
struct FieldDifference {
  std::string field, a, b;
};
std::optional<FieldDifference> first_difference(const nlohmann::json& a, const nlohmann::json& b);

/// The inverse of to_json: a TrainConfig from a run folder's config.json, to be validated
/// like flags. Accepts exactly the keys to_json writes; "dp" and "global_batch_size", which
/// to_json derives from the others, are type-checked and ignored (the batch per replica is
/// what it restores), and so is "out" (a rerun gets a fresh folder unless --out is given).
/// With "micro_batch_size" set, "micro_batches" is derived from it too: validate makes it
/// again from the batch, so that a flag changing the batch changes the count.
/// Throws std::invalid_argument (one line) naming an unknown key, or a key of the wrong type
/// with the type expected.
TrainConfig config_from_json(const nlohmann::json& doc);

} // namespace meshsim
