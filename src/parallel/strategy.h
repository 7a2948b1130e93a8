// Strategy: how one rank takes a training step. Every strategy wraps an unmodified model
// built by models/, and the trainer runs the same loop for all of them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "mesh/rank_runner.h"
#include "models/layers/flops.h"
#include "models/models.h"
#include "optim/optimizer.h"

namespace meshsim {

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  /// int64 [B]: each row's index in the step's global batch (what dropout masks are drawn
  /// from, models/layers/dropout.h); undefined: the rows are the replica's contiguous slice,
  /// replica r of a global batch of R·B holding r·B .. r·B + B - 1.
  torch::Tensor samples;
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
  /// The batch on `device` (a part that is not there stays undefined).
  Batch to(const torch::Device& device) const {
    return {inputs.defined() ? inputs.to(device) : inputs,
            targets.defined() ? targets.to(device) : targets, samples};
  }
};

/// `batch.samples`, or replica `replica`'s contiguous slice (see Batch::samples), int64 on the
/// CPU.
torch::Tensor batch_samples(const Batch& batch, int replica);

/// Which slice of the data a rank trains on: `index` of `replicas` equal shards, as
/// DistributedSampler(num_replicas, rank) gives it. Ranks that hold parts of one model replica
/// (tensor or pipeline parallel) share a shard.
struct DataShard {
  int replicas = 1;
  int index = 0;
};

struct StrategyOptions {
  std::string model = "cnn";
  uint64_t seed = 0;
  TransformerShape shape;               // --model gpt
  int tp = 1, pp = 1;           // the mesh: dp = world / (tp · pp · cp)
  int cp = 1;                   // context parallel: the sequence over cp ranks
  int ep = 1;                   // expert parallel: the routed experts over ep ranks of dp × cp
  int node_size = 0;            // GPUs a node of the target cluster (--cluster); 0: one node
  std::string moe_dispatch = "deepep"; // how ep exchanges tokens: deepep | alltoall
  bool loss_upcast = true;      // false: the cross-entropy in the logits' precision (loss_fn)
  std::string cp_comm = "allgather"; // how cp brings K/V to the queries: allgather | ring
  bool sequence_parallel = false; // with tp > 1: norms and residuals on 1/tp of the sequence
  bool pp_scatter_gather = false; // pipeline messages sent 1/tp a rank, gathered over tp
  int zero = 0;                 // ZeRO stage on the data-parallel dimension
  int dp_shard = 0;             // HSDP: ZeRO shards within groups of this many dp ranks (0: all)
  bool reshard_after_forward = true; // ZeRO 3: free a block's gathered weights after forward
  bool reduce_fp32 = false;     // ZeRO 1, 2, 3: 16-bit gradients reduced in fp32
  bool distributed_optimizer = false; // ZeRO 1 as Megatron's (ZeroOptions::distributed_optimizer)
  std::string schedule = "1f1b";
  int virtual_stages = 1;       // model chunks per pipeline stage (interleaved 1F1B when > 1)
  /// Units (transformer blocks) of each model chunk, pp × virtual_stages of them in virtual
  /// stage order; empty: the units split evenly (config/stage_layers.h resolves the flags).
  std::vector<int64_t> stage_layers;
  int micro_batches = 1;
  Recompute recompute = Recompute::None; // what the transformer blocks recompute in backward
  AttentionKind attention = AttentionKind::Eager; // the attention core (ModelOptions::attention)
  bool eager_elementwise = false; // counts: elementwise steps op by op (ModelOptions)
  torch::Dtype dtype = torch::kFloat32; // parameters and activations (float64 in tests)
  /// fp32 | bf16 | fp16. bf16 and fp16 are mixed precision (optim/optimizer.h): the model's
  /// parameters, gradients and activations in 16 bits, fp32 master weights and moments in the
  /// optimizer. They replace `dtype` and need it to be float32: float64 is for tests of exact
  /// equivalence, which mixed precision is not.
  std::string precision = "fp32";
  /// FP8 training in a plan (--precision fp8 with precision "bf16"): every GPU also holds an
  /// FP8 copy of each transformer-block weight it keeps and its transpose, and the scaling
  /// state of each of those GEMMs (parallel/fp8_state.h). The math itself runs in bf16 here;
  /// the cost model times the blocks' GEMMs at the FP8 peak (PredictOptions::fp8).
  bool fp8 = false;
  torch::Device device = torch::kCPU;   // where the model is built: meta for plans
  OptimizerOptions optimizer;
  double bucket_mb = 25;
  /// ddp: each bucket's all-reduce starts during backward, once its gradients are there
  /// (parallel/data/buckets.h); false: all of them after backward.
  bool overlap = true;
  /// Whole weights to build the model from instead of the seed's (ModelOptions::initial).
  std::shared_ptr<const std::vector<std::pair<std::string, torch::Tensor>>> initial;
};

class Strategy {
public:
  virtual ~Strategy() = default;

  /// One training step on this rank's batch. Returns the loss averaged over every sample
  /// of the step on every rank (valid on rank 0; other ranks may return it too).
  virtual double step(const Batch& batch, int64_t step_number) = 0;

  /// True when rank 0 loads the whole global batch and scatters it (DataParallel).
  virtual bool rank0_loads_global_batch() const { return false; }

  /// The data this rank trains and evaluates on. Default: one shard per rank.
  virtual DataShard data_shard(const RankContext& ctx) const {
    return DataShard{ctx.world_size, ctx.rank};
  }

  /// Scores a test batch: (correct predictions, predictions) that this rank contributes to
  /// the accuracy; ranks sharing a shard must count it once between them. Collective for
  /// strategies whose model is split across ranks. Default: eval_model() on the whole batch.
  virtual std::pair<int64_t, int64_t> evaluate(const Batch& batch);

  /// Collective: the whole model's parameters in the unsplit model's order, on rank 0 (other
  /// ranks may return an empty list). Default: this rank's model.
  virtual std::vector<torch::Tensor> full_parameters();

  /// False when model() and optimizer() hold the whole training state, and rank 0 writes it;
  /// true when the state is split across ranks and each rank writes its own part with
  /// save_state (train/checkpoint.h).
  virtual bool checkpoints_per_rank() const { return false; }
  /// Per-rank checkpoints: this rank's part of the model and optimizer state. load_state is
  /// collective (parts may need regathering) and throws std::runtime_error for a part that
  /// does not fit.
  virtual void save_state(torch::serialize::OutputArchive&) const {}
  virtual void load_state(torch::serialize::InputArchive&) {}

  /// Makes this rank's model current for evaluation and returns it.
  virtual torch::nn::Sequential eval_model() = 0;

  /// The authoritative model and optimizer for checkpoints (rank 0's).
  virtual torch::nn::Sequential model() = 0;
  virtual Optimizer* optimizer() = 0;
};

/// The dtype the model is built in: `dtype` for fp32, bfloat16 or half for bf16 and fp16.
/// Throws std::invalid_argument for another precision, or a 16-bit one over a `dtype` other
/// than float32.
torch::Dtype compute_dtype(const StrategyOptions& options);

/// Makes bf16 training possible on this CPU, once per process: LibTorch 1.13's oneDNN has
/// bf16 linear and convolution kernels only with AVX-512 (elsewhere they fail with "could not
/// create a primitive descriptor iterator"), while ATen's own kernels cover bf16 everywhere;
/// so where a bf16 linear and convolution fail, oneDNN is turned off for the process (and
/// the log says so). A no-op for every other dtype.
void ensure_kernels_for(torch::Dtype dtype);

/// `inputs` in the model's `dtype` when they are floating point (images; token ids stay
/// int64), as Megatron feeds a 16-bit model: the cast is the first op of the forward.
torch::Tensor model_inputs(const torch::Tensor& inputs, torch::Dtype dtype);

/// Names accepted by --strategy.
const std::vector<std::string>& strategy_names();

/// Builds `name` for the calling rank: the model (charged as `parameters`), gradients,
/// optimizer state and any communication buffers. Collective: all ranks call it.
std::unique_ptr<Strategy> make_strategy(const std::string& name, RankContext& ctx,
                                        const StrategyOptions& options);

/// Cross-entropy on logits ([B, classes], or [B, T, vocab] with [B, T] targets), the loss
/// every strategy trains. 16-bit logits are cast to fp32 first, as Megatron's cross-entropy
/// and PyTorch's recipes do, so the loss and its softmax are fp32 in every precision; with
/// `upcast` false (--no-loss-upcast) it runs in the logits' own precision, its log-softmax
/// kept in 16 bits (NeMo AutoModel's `fp32_upcast: false`).
torch::Tensor loss_fn(const torch::Tensor& logits, const torch::Tensor& targets,
                      bool upcast = true);

/// The kernels loss_fn runs on `tokens` rows of `classes` logits of `elem_bytes` bytes, each
/// counted as one pass over its tensors: forward the cast to fp32, log-softmax (read, written)
/// and the gather of the targets' log-probabilities; backward the gather's gradient (zeros
/// written, the targets' entries scattered), log-softmax's (its gradient and output read, one
/// written) and the cast back; without `upcast` the same passes at `elem_bytes`, no casts.
LossWork loss_work(double tokens, double classes, double elem_bytes, bool upcast = true);

/// The loss a strategy trains with: loss_fn on whole logits, or, where tensor parallelism's
/// head leaves the logits split over the vocabulary (VocabParallelHead::parallel_output),
/// vocab_parallel_cross_entropy over its group.
class TrainingLoss {
public:
  explicit TrainingLoss(bool upcast = true) : upcast_(upcast) {} // loss_fn
  TrainingLoss(Communicator& comm, Group group, int index);
  torch::Tensor operator()(const torch::Tensor& output, const torch::Tensor& targets) const;
  /// The kernels that loss runs on `output` (its per-token rows of the last dimension).
  LossWork work(const torch::Tensor& output) const;

private:
  Communicator* comm_ = nullptr; // null: loss_fn
  Group group_;
  int index_ = 0;
  bool upcast_ = true;            // loss_fn's
};

/// The loss as a number; 0 on the meta device, where a plan has shapes and no values.
double loss_value(const torch::Tensor& loss);

} // namespace meshsim
