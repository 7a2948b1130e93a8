// `meshsim train`'s flags: each one bound to its TrainConfig field, whole numbers checked on
// their text so that an error names the value as it was given.
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/integer_flag.h"

namespace meshsim {
namespace {

// The model, its data and its layout over the GPUs.
void add_model_layout_flags(CLI::App& app, TrainConfig& c) {
  add_integer_flag(app, "--gpus", c.gpus, "number of virtual GPUs")->capture_default_str();
  app.add_option("--strategy", c.strategy, "single | ddp | dp")->capture_default_str();
  app.add_option("--model", c.model, "cnn | lenet | gpt | llama | resnet50, or a preset (meshsim models)")
      ->capture_default_str();
  app.add_option(
      "--preset", c.preset,
      "start from this model's published shape (meshsim models); shape flags override it");
  app.add_option("--hf-config", c.hf_config,
                 "llama, mistral, qwen2, qwen3, mixtral or qwen3_moe: the model's shape from this "
                 "Hugging Face config.json (or a folder holding one); shape flags override it");
  app.add_option("--data", c.data,
                 "IDX folder (MNIST/Fashion-MNIST, .gz or raw) for cnn/lenet, any text file for gpt, "
                 "or 'synthetic' (default: " + std::string(kDefaultData) + ", or " + kDefaultText +
                     " for gpt; resnet50 reads synthetic images only)");
  add_integer_flag(app, "--tp", c.tp, "tensor-parallel size (gpt)")->capture_default_str();
  app.add_flag("--sequence-parallel", c.sequence_parallel,
               "with --tp: norms and residuals on 1/tp of the sequence each, reduce-scatter and "
               "all-gather instead of all-reduce");
  add_integer_flag(app, "--pp", c.pp, "pipeline stages")->capture_default_str();
  app.add_flag("--pp-scatter-gather", c.pp_scatter_gather,
               "with --tp and --pp, without --sequence-parallel: each tp rank sends 1/tp of a "
               "stage's output and of its gradient, all-gathered over tp on arrival (Megatron-LM "
               "of 2021, Narayanan et al. SC'21 §4.1)");
  add_integer_flag(app, "--cp", c.cp,
                   "context-parallel size (gpt, llama): each rank holds 2 of 2·cp chunks of the "
                   "sequence")
      ->capture_default_str();
  app.add_option("--cp-comm", c.cp_comm,
                 "how --cp brings keys and values to the queries: allgather | ring")
      ->capture_default_str();
  add_integer_flag(app, "--ep", c.ep,
                   "expert-parallel size (--moe-experts): the routed experts over ep ranks of "
                   "the dp × cp ranks, tokens exchanged by all_to_all")
      ->capture_default_str();
  app.add_option("--moe-dispatch", c.moe_dispatch,
                 "how --ep exchanges tokens: deepep (once to each GPU holding any of a token's "
                 "experts, across nodes once a node, DeepEP's) | alltoall (once per chosen "
                 "expert, Megatron's default dispatcher)")
      ->capture_default_str();
  add_integer_flag(app, "--zero", c.zero, "ZeRO stage on the data-parallel dimension: 0 | 1 | 2 | 3")
      ->capture_default_str();
  add_integer_flag(app, "--dp-shard", c.dp_shard,
                   "HSDP: ZeRO shards within groups of this many data-parallel ranks and "
                   "replicates across the dp / N groups (default: all of dp)",
                   /*min=*/1);
  app.add_flag("!--no-reshard-after-forward", c.reshard_after_forward,
               "zero 3: keep each block's gathered parameters from its forward to its backward "
               "(one all-gather less per block, more memory)");
  app.add_flag("--reduce-fp32", c.reduce_fp32,
               "zero 1, 2 or 3: reduce the 16-bit gradients in fp32, twice the bytes (zero 2, "
               "3: FSDP2's reduce_dtype=float32, torchtitan's and NeMo AutoModel's default; "
               "zero 1: an fp32 gradient buffer, as Megatron-LM's bf16 main_grad)");
  app.add_flag("--distributed-optimizer", c.distributed_optimizer,
               "zero 1 as Megatron-LM's distributed optimizer: the gradients reduce-scattered "
               "(not all-reduced), the updated parameters all-gathered block by block as the next "
               "forward reaches them, the next block's beside this one's compute "
               "(--overlap-grad-reduce, --overlap-param-gather)");
  app.add_option("--schedule", c.schedule, "pipeline schedule: naive | gpipe | 1f1b")
      ->capture_default_str();
  add_integer_flag(app, "--virtual-stages", c.virtual_stages,
                   "model chunks per pipeline stage: more than 1 interleaves them (1f1b; "
                   "micro-batches a multiple of --pp)",
                   /*min=*/1)
      ->capture_default_str();
  add_integer_flag(app, "--first-stage-layers", c.first_stage_layers,
                   "gpt/llama with --pp: transformer blocks on the first stage (the other stages "
                   "share the rest evenly)",
                   /*min=*/1);
  add_integer_flag(app, "--last-stage-layers", c.last_stage_layers,
                   "gpt/llama with --pp: transformer blocks on the last stage", /*min=*/1);
  app.add_option("--stage-layers", c.stage_layers,
                 "gpt/llama with --pp: the blocks of every stage, e.g. 3,4,4,3 (with "
                 "--virtual-stages: of every model chunk, pp × V counts in virtual-stage order)");
  add_integer_flag(app, "--micro-batches", c.micro_batches,
                   "micro-batches per step (pipeline, or accumulation); default 1, or what "
                   "--micro-batch-size makes",
                   /*min=*/1);
  add_integer_flag(app, "--micro-batch-size", c.micro_batch_size,
                   "samples per micro-batch: micro-batches = global batch ÷ (this × dp)", /*min=*/1);
  app.add_option("--recompute", c.recompute,
                 "what backward recomputes: none | selective (the attention core) | op "
                 "(torchtitan's op-level selective checkpointing: each block but every other "
                 "matmul and the fused attention kernel, whose outputs are kept) | full (each "
                 "transformer block)")
      ->capture_default_str();
  app.add_option("--attention", c.attention,
                 "gpt/llama: the attention core: fused (FlashAttention's memory: q, k, v, the "
                 "output and one number per row kept; the scores recomputed in backward) | eager "
                 "(the [B, heads, T, T] softmax kept)")
      ->capture_default_str();
  app.add_option("--elementwise", c.elementwise,
                 "predictions: how the blocks' elementwise steps run: fused (one kernel a step, as "
                 "torch.compile and Transformer Engine run them) | eager (op by op, as PyTorch "
                 "without torch.compile: RMSNorm 8 kernels, the rotation of q or k 5)")
      ->capture_default_str();
  app.add_option("--precision", c.precision,
                 "fp32 | bf16 (16-bit params and grads, fp32 master weights and Adam state) | fp16 "
                 "(as bf16, with dynamic loss scaling; needs a GPU) | fp8 (meshsim plan only: bf16 "
                 "with the blocks' GEMMs in FP8, docs/cost-model.md)")
      ->capture_default_str();
  app.add_flag("!--no-loss-upcast", c.loss_upcast,
               "the cross-entropy in the logits' precision, its log-softmax kept in 16 bits "
               "(NeMo AutoModel's fp32_upcast: false), not cast to fp32 first (--tp 1)");
  add_integer_flag(app, "--global-batch-size", c.global_batch_size,
                   "samples per step over all replicas (overrides --batch-size)", /*min=*/1);
  add_integer_flag(app, "--layers", c.shape.layers, "gpt/llama: transformer blocks")
      ->capture_default_str();
  add_integer_flag(app, "--hidden", c.shape.hidden, "gpt/llama: hidden size")->capture_default_str();
  add_integer_flag(app, "--heads", c.shape.heads, "gpt/llama: attention heads")->capture_default_str();
  add_integer_flag(app, "--kv-heads", c.shape.kv_heads,
                   "llama: key/value heads (grouped-query attention; default: --heads)", /*min=*/1);
  add_integer_flag(
      app, "--ffn-hidden", c.shape.ffn_hidden,
      "gpt/llama: the MLP's inner width (default: 4 × hidden for gpt, Meta's rule for llama)",
      /*min=*/1);
  add_integer_flag(app, "--seq-len", c.shape.seq_len, "gpt/llama: tokens per sample")
      ->capture_default_str();
  add_integer_flag(app, "--vocab", c.shape.vocab, "gpt/llama: vocabulary (256 for byte-level text)")
      ->capture_default_str();
  app.add_flag("--tie-head,!--no-tie-head", c.shape.tie_head,
               "gpt/llama: the LM head shares the token embedding (--no-tie-head: its own weight)");
  app.add_option("--rope-theta", c.shape.rope_theta, "llama: the rotary embedding's base")
      ->capture_default_str();
  app.add_option("--dropout", c.dropout,
                 "gpt/llama: dropout probability in training, on the attention probabilities and "
                 "the attention's and MLP's outputs (the same masks on every layout)")
      ->capture_default_str();
  add_integer_flag(app, "--moe-experts", c.shape.moe.experts,
                   "llama: a mixture of experts with this many routed experts in the feed-forward "
                   "(default: none, a dense MLP)", /*min=*/1);
  add_integer_flag(app, "--moe-top-k", c.shape.moe.top_k, "llama MoE: experts per token", /*min=*/1)
      ->capture_default_str();
  add_integer_flag(app, "--moe-ffn", c.shape.moe.ffn,
                   "llama MoE: each routed expert's SwiGLU width (default: the dense MLP's)",
                   /*min=*/1);
  add_integer_flag(app, "--moe-shared-ffn", c.shape.moe.shared_ffn,
                   "llama MoE: the width of the shared experts every token passes (default: none)",
                   /*min=*/1);
  add_integer_flag(app, "--moe-dense-layers", c.shape.moe.dense_layers,
                   "llama MoE: the first layers keep the dense MLP", /*min=*/0)
      ->capture_default_str();
  app.add_option("--moe-router", c.shape.moe.router,
                 "llama MoE: softmax (Mixtral, Qwen3-MoE) or sigmoid (DeepSeek-V3)")
      ->capture_default_str();
  app.add_option("--moe-aux-loss", c.shape.moe.aux_loss,
                 "llama MoE: the load-balancing loss's coefficient (0: none)")
      ->capture_default_str();
  app.add_option("--moe-capacity-factor", c.shape.moe.capacity_factor,
                 "llama MoE: each expert takes at most this factor of its even share of the "
                 "tokens, dropping the rest (default 0: dropless)")
      ->capture_default_str();
}

// The device, the training's length and optimizer, the communication, checkpoints and
// outputs. After add_model_layout_flags: --help lists the flags in this order.
void add_run_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--device", c.device,
                 "physical device: cpu, cuda (virtual GPUs carved out of CUDA card 0), or auto "
                 "(cuda when a usable GPU is present)")
      ->capture_default_str()
      ->check([](const std::string& v) {
        return v == "meta" ? std::string("meta is the device meshsim plan runs on, not one to ask for")
                           : std::string();
      });
  add_integer_flag(app, "--epochs", c.epochs, "", /*min=*/1)->capture_default_str();
  add_integer_flag(app, "--max-steps", c.max_steps, "stop after this many steps (0: no limit)",
                   /*min=*/0)
      ->capture_default_str();
  add_integer_flag(app, "--batch-size", c.batch_size, "batch size per data-parallel replica", /*min=*/1)
      ->capture_default_str();
  add_integer_flag(app, "--seed", c.seed, "", /*min=*/0)->capture_default_str();
  add_integer_flag(app, "--log-every", c.log_every, "steps between metrics lines", /*min=*/1)
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer.name, "adam | sgd")->capture_default_str();
  app.add_option("--lr", c.optimizer.lr, "learning rate (default 1e-3 for adam, 0.01 for sgd)");
  app.add_option("--momentum", c.optimizer.momentum, "sgd momentum")->capture_default_str();
  app.add_option("--gpu-mem", c.gpu_mem, "capacity per GPU: 512MiB, 2GiB, ... or auto")
      ->capture_default_str();
  app.add_option("--bucket-mb", c.bucket_mb, "gradient bucket size in MiB")->capture_default_str();
  app.add_option("--backend", c.backend,
                 "sim: every GPU a thread of this process; c10d: one rank per process, through "
                 "PyTorch's c10d (Gloo; NCCL with --device cuda), started by meshsim launch, "
                 "torchrun, mpirun or srun")
      ->capture_default_str();
  app.add_flag("!--no-overlap", c.overlap,
               "ddp: all-reduce the gradient buckets after backward, not during it; zero 2 and "
               "3: wait for each reduce-scatter before backward goes on");
  app.add_flag("--tp-comm-overlap", c.tp_comm_overlap,
               "plans: tensor parallelism's collectives run beside the GEMMs around them, as "
               "Megatron's --tp-comm-overlap and torchtitan's async TP run them");
  app.add_option("--comm-timeout", c.comm_timeout_s, "seconds a collective waits for all ranks")
      ->capture_default_str();
  add_integer_flag(app, "--checkpoint-every", c.checkpoint_every,
                   "steps between checkpoints (0: at the end only)", /*min=*/0)
      ->capture_default_str();
  add_integer_flag(app, "--keep-checkpoints", c.keep_checkpoints,
                   "keep only the newest N checkpoints (0: keep all)", /*min=*/0)
      ->capture_default_str();
  app.add_option("--resume", c.resume, "run folder or checkpoint to continue from");
  app.add_option("--init-from", c.init_from,
                 "gpt/llama: start from the weights of this Hugging Face folder (config.json and "
                 "model.safetensors, as meshsim export --hf writes)");
  app.add_option("--out", c.out, "run folder (default runs/<timestamp>)");
  add_integer_flag(app, "--synthetic-train", c.synthetic_train,
                   "training samples of --data synthetic", /*min=*/1)
      ->capture_default_str();
  add_integer_flag(app, "--synthetic-test", c.synthetic_test, "test samples of --data synthetic", /*min=*/1)
      ->capture_default_str();
  add_integer_flag(app, "--eval-limit", c.eval_limit,
                   "evaluate on the first N test samples (0: all)", /*min=*/0)
      ->capture_default_str();
  app.add_option("--inject-fault", c.inject_fault,
                 "RANK:STEP — that rank leaves the run at that step (tests failure handling)");
  app.add_flag("!--no-progress", c.progress, "no progress bar or lines");
  app.add_flag("--memory-snapshot", c.memory_snapshot,
               "memory_snapshot/gpuN.pickle: each GPU's allocations of the last 3 steps, in "
               "PyTorch's memory snapshot format");
  app.add_option("--cluster", c.cluster, "also predict the run on this cluster, e.g. 8xa100-80 or 4x8xh100");
  app.add_option("--intra", c.intra, "with --cluster: link inside a node (nvlink3, nvlink4, pcie3, ...)");
  app.add_option("--inter", c.inter, "with --cluster: link between nodes (hdr, ndr, 100gbe)");
}

} // namespace

void add_train_flags(CLI::App& app, TrainConfig& c) {
  add_model_layout_flags(app, c);
  add_run_flags(app, c);
  app.callback([&c, &app] {
    if (c.optimizer.name == "sgd" && app.count("--lr") == 0) c.optimizer.lr = 0.01;
    // --micro-batches on the command line replaces a micro-batch size from --config.
    if (app.count("--micro-batches") > 0 && app.count("--micro-batch-size") == 0)
      c.micro_batch_size = 0;
    // A preset sets the shape first; each shape flag given then overrides its field.
    ModelFlagsGiven given;
    given.model = app.count("--model") > 0;
    given.preset = app.count("--preset") > 0;
    for (const std::string& flag : shape_flag_names())
      if (app.count(flag) > 0)
        given.shape.push_back(flag);
    try {
      if (app.count("--hf-config") > 0)
        apply_hf_config(c, given);
      else
        apply_preset(c, given);
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError(e.what());
    }
  });
}

} // namespace meshsim
