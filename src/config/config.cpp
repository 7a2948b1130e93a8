// Validation of TrainConfig: every bad value is a one-line error before anything runs; and
// config.json, its saved form, both ways.
#include "config/config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "base/printable.h"
#include "comm/c10d_backend.h"
#include "cost/hardware.h"
#include "device/physical_device.h"
#include "memory/category.h"
#include "mesh/parallel_dims.h"
#include "models/models.h"
#include "models/presets.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/strategy.h"
#include "base/json_integer.h"
#include "config/byte_size.h"

namespace meshsim {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

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

// LibTorch computes a tensor's bytes in int64 ("Storage size calculation overflowed"): the
// largest activations of one micro-batch, eager attention's scores [b, heads, s, s] and the
// logits [b, s, vocab], must stay far inside it. In floating point, so nothing overflows first.
void check_activation_sizes(const TrainConfig& c) {
  const TransformerShape& g = c.shape;
  const double b = static_cast<double>(c.batch_size / c.micro_batches);
  const double s = static_cast<double>(g.seq_len);
  const double scores = b * static_cast<double>(g.heads) * s * s;
  require(scores <= kMaxTensorNumbers,
          fmt::format("--seq-len {}: one micro-batch's attention scores [{:.0f}, {}, {}, {}] would "
                      "hold {:.3g} numbers, more than a tensor can address ({:.3g})",
                      g.seq_len, b, g.heads, g.seq_len, g.seq_len, scores, kMaxTensorNumbers));
  const double logits = b * s * static_cast<double>(g.vocab);
  require(logits <= kMaxTensorNumbers,
          fmt::format("--seq-len {} with --vocab {}: one micro-batch's logits [{:.0f}, {}, {}] "
                      "would hold {:.3g} numbers, more than a tensor can address ({:.3g})",
                      g.seq_len, g.vocab, b, g.seq_len, g.vocab, logits, kMaxTensorNumbers));
}

void validate_layout(TrainConfig& c) {
  // Caught here because tp × pp would overflow an int in ParallelDims for sizes past --gpus.
  require(c.tp < 1 || c.pp < 1 || (c.tp <= c.gpus && c.pp <= c.gpus),
          fmt::format("--gpus {} is not divisible by --tp {} × --pp {} = {}", c.gpus, c.tp, c.pp,
                      static_cast<int64_t>(c.tp) * c.pp));
  const ParallelDims dims = ParallelDims::make(c.gpus, c.tp, c.pp);
  require(c.zero >= 0 && c.zero <= 3, fmt::format("--zero must be 0, 1, 2 or 3, got {}", c.zero));
  require(contains(schedule_names(), c.schedule),
          fmt::format("unknown schedule '{}' (choose naive, gpipe or 1f1b)", c.schedule));
  resolve_micro_batches(c, dims);
  require(c.recompute == "none" || c.recompute == "selective" || c.recompute == "full",
          fmt::format("unknown --recompute '{}' (choose none, selective or full)", c.recompute));
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
          fmt::format("--tp, --pp, --zero, --micro-batches and --recompute run with --strategy ddp "
                      "(the default), not {}", c.strategy));
  require(c.zero <= 1 || (c.tp == 1 && c.pp == 1),
          fmt::format("--zero {} runs with data parallelism alone so far; use --zero 1 with --tp or --pp",
                      c.zero));
  require(!c.sequence_parallel || c.tp > 1,
          "--sequence-parallel needs --tp 2 or more: it splits the sequence over the tp group");

  if (is_transformer(c.model)) {
    const auto& g = c.shape;
    validate_shape(c.model, g);
    require(g.heads % c.tp == 0,
            fmt::format("--heads {} is not divisible by --tp {}", g.heads, c.tp));
    require(preset_kv_heads(g) % c.tp == 0,
            fmt::format("--kv-heads {} is not divisible by --tp {}", preset_kv_heads(g), c.tp));
    require(!c.sequence_parallel || g.seq_len % c.tp == 0,
            fmt::format("--seq-len {} is not divisible by --tp {} (--sequence-parallel splits the "
                        "sequence over the tp group)",
                        g.seq_len, c.tp));
    require(g.layers >= c.pp,
            fmt::format("--layers {} is fewer than --pp {}: every stage needs a layer", g.layers, c.pp));
    require(g.layers / c.pp >= c.virtual_stages,
            fmt::format("--layers {} is fewer than --pp {} × --virtual-stages {} = {}: every model "
                        "chunk needs a layer",
                        g.layers, c.pp, c.virtual_stages,
                        static_cast<int64_t>(c.pp) * c.virtual_stages));
    require(!g.tie_head || c.zero < 3,
            "--tie-head with --zero 3 is not supported yet: stage 3 frees the gathered embedding "
            "weight that the tied head reads; use --no-tie-head");
    require(!g.tie_head || c.pp == 1,
            "--tie-head needs --pp 1: the embedding and the head would be on different stages");
    require(c.data == "synthetic" || g.vocab >= 256,
            fmt::format("--vocab {} is too small for byte-level text (256 byte values)", g.vocab));
  } else {
    require(c.tp == 1, "--tp needs --model gpt: its plan splits attention and the MLP");
    require(c.recompute == "none", "--recompute applies to the transformer blocks of --model gpt");
    ModelOptions shapes; // the layers' count only: on meta where the model can be
    if (builds_on_meta(c.model))
      shapes.device = torch::kMeta;
    const int units = pipeline_units(build_model(c.model, shapes));
    require(c.pp <= units, fmt::format("--pp {} is more than {}'s {} layers with parameters", c.pp,
                                       c.model, units));
    require(units / c.pp >= c.virtual_stages,
            fmt::format("--pp {} × --virtual-stages {} = {} is more than {}'s {} layers with "
                        "parameters: every model chunk needs one",
                        c.pp, c.virtual_stages, static_cast<int64_t>(c.pp) * c.virtual_stages,
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
  if (is_transformer(c.model))
    check_activation_sizes(c);
}

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

} // namespace

bool uses_mesh_layout(const TrainConfig& c) {
  return c.tp > 1 || c.pp > 1 || c.zero > 0 || c.micro_batches > 1 || c.recompute != "none";
}

namespace {

// A text value with a control character (a flag given $'dd\rp', a config.json's "\u0000"):
// refused first, naming it printably, so that no message below quotes it raw.
void check_texts_printable(const TrainConfig& c) {
  const std::pair<const char*, const std::string*> texts[] = {
      {"--strategy", &c.strategy},   {"--model", &c.model},         {"--preset", &c.preset},
      {"--data", &c.data},           {"--device", &c.device},       {"--schedule", &c.schedule},
      {"--recompute", &c.recompute}, {"--precision", &c.precision}, {"--optimizer", &c.optimizer.name},
      {"--gpu-mem", &c.gpu_mem},     {"--backend", &c.backend},     {"--resume", &c.resume},
      {"--out", &c.out},             {"--cluster", &c.cluster},     {"--intra", &c.intra},
      {"--inter", &c.inter},         {"--inject-fault", &c.inject_fault}};
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
  require(contains(strategy_names(), c.strategy),
          fmt::format("unknown strategy '{}' (choose single, ddp or dp)", c.strategy));
  if (!contains(model_names(), c.model)) {
    std::string names;
    for (const std::string& n : model_names())
      names += n + ", ";
    throw std::invalid_argument(fmt::format(
        "unknown model '{}' (choose {}or a preset: nearest {}; `meshsim models` lists them)",
        c.model, names, nearest_preset_names(c.model)));
  }
  if (!c.preset.empty()) {
    const ModelPreset* p = find_preset(c.preset);
    require(p != nullptr, unknown_preset_message(c.preset));
    require(p->family == c.model,
            fmt::format("preset {} is a {} model, not {}", p->name, p->family, c.model));
  }
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
  require(c.precision == "fp32" || c.precision == "bf16" || c.precision == "fp16",
          fmt::format("unknown --precision '{}' (choose fp32, bf16 or fp16)", c.precision));
  // LibTorch 1.13's CPU kernels have no fp16 matmul, convolution or layer norm (addmm,
  // slow_conv2d and LayerNormKernelImpl are "not implemented for 'Half'"); bf16 has them all.
  require(c.precision != "fp16" || c.device != "cpu",
          "--precision fp16 cannot train on the CPU (LibTorch 1.13 has no fp16 CPU matmul); use bf16");
  require(c.optimizer.name == "adam" || c.optimizer.name == "sgd",
          fmt::format("unknown optimizer '{}' (choose adam or sgd)", c.optimizer.name));
  require(std::isfinite(c.optimizer.lr) && c.optimizer.lr > 0,
          fmt::format("--lr must be a positive finite number, got {}", c.optimizer.lr));
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
  if (c.data.empty())
    c.data = is_transformer(c.model) ? kDefaultText
             : c.model == "resnet50" ? "synthetic"
                                     : kDefaultData;
  require(c.model != "resnet50" || c.data == "synthetic",
          fmt::format("--model resnet50 reads 3×224×224 images of 1000 classes: only --data "
                      "synthetic makes them, not '{}'",
                      c.data));
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
          {"virtual_stages", c.virtual_stages},
          {"micro_batches", c.micro_batches},
          {"micro_batch_size", c.micro_batch_size},
          {"recompute", c.recompute},
          {"preset", c.preset},
          {"precision", c.precision},
          {"sequence_parallel", c.sequence_parallel},
          {"gpt",
           {{"layers", c.shape.layers},
            {"hidden", c.shape.hidden},
            {"heads", c.shape.heads},
            {"kv_heads", c.shape.kv_heads},
            {"ffn_hidden", c.shape.ffn_hidden},
            {"seq_len", c.shape.seq_len},
            {"vocab", c.shape.vocab},
            {"tie_head", c.shape.tie_head},
            {"rope_theta", c.shape.rope_theta}}},
          {"seed", c.seed},
          {"log_every", c.log_every},
          {"optimizer", c.optimizer.name},
          {"lr", c.optimizer.lr},
          {"momentum", c.optimizer.momentum},
          {"gpu_mem", c.gpu_mem},
          {"bucket_mb", c.bucket_mb},
          {"overlap", c.overlap},
          {"backend", c.backend},
          {"comm_timeout_s", c.comm_timeout_s},
          {"checkpoint_every", c.checkpoint_every},
          {"memory_snapshot", c.memory_snapshot},
          {"keep_checkpoints", c.keep_checkpoints},
          {"resume", c.resume},
          {"synthetic_train", c.synthetic_train},
          {"synthetic_test", c.synthetic_test},
          {"eval_limit", c.eval_limit},
          {"cluster", c.cluster},
          {"intra", c.intra},
          {"inter", c.inter}};
}

namespace {

using nlohmann::json;

// Keys are quoted as JSON strings, so a key holding a newline still gives a one-line error.
std::string quoted(const std::string& key) {
  return json(key).dump(-1, ' ', false, json::error_handler_t::replace);
}

[[noreturn]] void wrong_type(const std::string& key, const json& value, const char* expected) {
  throw std::invalid_argument(
      fmt::format("config.json: {} must be {}, got {}", quoted(key), expected, value.type_name()));
}

// An integer that fits Int: a float or a number past Int is refused, never cast.
template <typename Int> Int integer(const json& v, const std::string& key) {
  if (const std::optional<Int> i = json_integer<Int>(v)) return *i;
  using Limits = std::numeric_limits<Int>;
  const std::string expected = fmt::format("an integer from {} to {}", Limits::min(), Limits::max());
  wrong_type(key, v, expected.c_str());
}

double number(const json& v, const std::string& key) {
  if (!v.is_number())
    wrong_type(key, v, "a number");
  return v.get<double>();
}

// A string with no control character: every value may be quoted in a one-line error, and a
// C string (an exception's message, a path) would end at a NUL.
std::string text(const json& v, const std::string& key) {
  if (!v.is_string())
    wrong_type(key, v, "a string");
  const std::string& s = v.get_ref<const std::string&>();
  if (has_control_character(s))
    throw std::invalid_argument(fmt::format(
        "config.json: {} holds a control character: {}", quoted(key), quoted(s)));
  return s;
}

bool boolean(const json& v, const std::string& key) {
  if (!v.is_boolean())
    wrong_type(key, v, "true or false");
  return v.get<bool>();
}

void read(const json& v, const std::string& k, int& out) { out = integer<int>(v, k); }
void read(const json& v, const std::string& k, int64_t& out) { out = integer<int64_t>(v, k); }
void read(const json& v, const std::string& k, uint64_t& out) { out = integer<uint64_t>(v, k); }
void read(const json& v, const std::string& k, double& out) { out = number(v, k); }
void read(const json& v, const std::string& k, std::string& out) { out = text(v, k); }
void read(const json& v, const std::string& k, bool& out) { out = boolean(v, k); }

using Setter = std::function<void(const json& value, const std::string& key)>;

// The setter of one field: reads the value as the field's type.
template <typename T> Setter to(T& field) {
  return [&field](const json& v, const std::string& k) { read(v, k, field); };
}

// Applies every member of `object` through `setters`; `prefix` names nested keys ("gpt.").
void apply(const json& object, const std::string& prefix,
           const std::map<std::string, Setter>& setters) {
  for (const auto& [key, value] : object.items()) {
    const auto it = setters.find(key);
    if (it == setters.end())
      throw std::invalid_argument(fmt::format("config.json: unknown key {}", quoted(prefix + key)));
    it->second(value, prefix + key);
  }
}

} // namespace

TrainConfig config_from_json(const json& doc) {
  if (!doc.is_object())
    throw std::invalid_argument(
        fmt::format("config.json: expected a JSON object, got {}", doc.type_name()));
  TrainConfig c;
  TransformerShape& g = c.shape;
  const std::map<std::string, Setter> gpt_setters = {
      {"layers", to(g.layers)},         {"hidden", to(g.hidden)},
      {"heads", to(g.heads)},           {"kv_heads", to(g.kv_heads)},
      {"ffn_hidden", to(g.ffn_hidden)}, {"seq_len", to(g.seq_len)},
      {"vocab", to(g.vocab)},           {"tie_head", to(g.tie_head)},
      {"rope_theta", to(g.rope_theta)},
  };
  // Derived keys: to_json computes them from the others, so they are checked and dropped.
  const auto derived = [](const json& v, const std::string& k) { integer<int64_t>(v, k); };
  const std::map<std::string, Setter> setters = {
      {"gpus", to(c.gpus)},
      {"strategy", to(c.strategy)},
      {"model", to(c.model)},
      {"preset", to(c.preset)},
      {"data", to(c.data)},
      {"device", to(c.device)},
      {"epochs", to(c.epochs)},
      {"max_steps", to(c.max_steps)},
      {"batch_size", to(c.batch_size)},
      {"global_batch_size", derived},
      {"tp", to(c.tp)},
      {"pp", to(c.pp)},
      {"dp", derived},
      {"zero", to(c.zero)},
      {"schedule", to(c.schedule)},
      {"virtual_stages", to(c.virtual_stages)},
      {"micro_batches", to(c.micro_batches)},
      {"micro_batch_size", to(c.micro_batch_size)},
      {"recompute", to(c.recompute)},
      {"precision", to(c.precision)},
      {"sequence_parallel", to(c.sequence_parallel)},
      {"gpt",
       [&](const json& v, const std::string& k) {
         if (!v.is_object())
           wrong_type(k, v, "an object");
         apply(v, k + ".", gpt_setters);
       }},
      {"seed", to(c.seed)},
      {"log_every", to(c.log_every)},
      {"optimizer", to(c.optimizer.name)},
      {"lr", to(c.optimizer.lr)},
      {"momentum", to(c.optimizer.momentum)},
      {"gpu_mem", to(c.gpu_mem)},
      {"bucket_mb", to(c.bucket_mb)},
      {"overlap", to(c.overlap)},
      {"backend", to(c.backend)},
      {"comm_timeout_s", to(c.comm_timeout_s)},
      {"checkpoint_every", to(c.checkpoint_every)},
      {"memory_snapshot", to(c.memory_snapshot)},
      {"keep_checkpoints", to(c.keep_checkpoints)},
      {"resume", to(c.resume)},
      {"synthetic_train", to(c.synthetic_train)},
      {"synthetic_test", to(c.synthetic_test)},
      {"eval_limit", to(c.eval_limit)},
      {"cluster", to(c.cluster)},
      {"intra", to(c.intra)},
      {"inter", to(c.inter)},
      // Not written by to_json, but a user may add it; a rerun gets its own folder.
      {"out", [](const json& v, const std::string& k) { text(v, k); }},
  };
  apply(doc, "", setters);
  if (c.micro_batch_size > 0)
    c.micro_batches = 0; // derived from the batch and the micro-batch size by validate
  return c;
}

} // namespace meshsim
