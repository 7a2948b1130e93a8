// config.json, TrainConfig's saved form, both ways: to_json writes every field; config_from_json
// reads them back, refusing an unknown key or a value of the wrong type in one line.
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "base/json_integer.h"
#include "base/printable.h"
#include "config/config.h"

namespace meshsim {

nlohmann::json to_json_fields(const TrainConfig& c);

namespace {

// The llama's variants from --hf-config and the file's name, written only when they differ
// from the plain model's, so that every earlier run's config.json (and fingerprint) reads the
// same.
void add_hf_fields(nlohmann::json& doc, const TrainConfig& c) {
  const TransformerShape plain, &g = c.shape;
  nlohmann::json& shape = doc["gpt"];
  if (!c.hf_config.empty())
    doc["hf_config"] = c.hf_config;
  if (g.head_dim != plain.head_dim)
    shape["head_dim"] = g.head_dim;
  if (g.qkv_bias)
    shape["qkv_bias"] = true;
  if (g.out_bias)
    shape["out_bias"] = true;
  if (g.qk_norm)
    shape["qk_norm"] = true;
  if (g.norm_eps != plain.norm_eps)
    shape["norm_eps"] = g.norm_eps;
  const RopeScaling& r = g.rope_scaling;
  if (!(r == plain.rope_scaling)) {
    shape["rope_scaling"] = {{"factor", r.factor},
                             {"low_freq_factor", r.low_freq_factor},
                             {"high_freq_factor", r.high_freq_factor},
                             {"original_max", r.original_max}};
    if (r.yarn) // the yarn fields only where they apply: earlier files read the same
      shape["rope_scaling"].update({{"yarn", true},
                                    {"beta_fast", r.beta_fast},
                                    {"beta_slow", r.beta_slow},
                                    {"mscale", r.mscale},
                                    {"mscale_all_dim", r.mscale_all_dim}});
  }
  const LatentShape& l = g.latent;
  if (l.kv_rank > 0)
    shape["latent"] = {{"q_rank", l.q_rank},     {"kv_rank", l.kv_rank},
                       {"nope_dim", l.nope_dim}, {"rope_dim", l.rope_dim},
                       {"v_dim", l.v_dim},       {"interleave", l.interleave}};
}

} // namespace

nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json doc = to_json_fields(c);
  add_hf_fields(doc, c);
  return doc;
}

nlohmann::json to_json_fields(const TrainConfig& c) {
  return {{"gpus", c.gpus},
          {"strategy", c.strategy},
          {"model", c.model},
          {"data", c.data},
          {"device", c.device},
          {"epochs", c.epochs},
          {"max_steps", c.max_steps},
          {"batch_size", c.batch_size},
          {"global_batch_size", c.batch_size * (c.gpus / (c.tp * c.pp * c.cp))},
          {"tp", c.tp},
          {"pp", c.pp},
          {"dp", c.gpus / (c.tp * c.pp * c.cp)},
          {"cp", c.cp},
          {"cp_comm", c.cp_comm},
          {"ep", c.ep},
          {"moe_dispatch", c.moe_dispatch},
          {"loss_upcast", c.loss_upcast},
          {"zero", c.zero},
          {"dp_shard", c.dp_shard},
          {"reshard_after_forward", c.reshard_after_forward},
          {"reduce_fp32", c.reduce_fp32},
          {"distributed_optimizer", c.distributed_optimizer},
          {"pp_scatter_gather", c.pp_scatter_gather},
          {"schedule", c.schedule},
          {"virtual_stages", c.virtual_stages},
          {"first_stage_layers", c.first_stage_layers},
          {"last_stage_layers", c.last_stage_layers},
          {"stage_layers", c.stage_layers},
          {"micro_batches", c.micro_batches},
          {"micro_batch_size", c.micro_batch_size},
          {"recompute", c.recompute},
          {"attention", c.attention},
          {"elementwise", c.elementwise},
          {"preset", c.preset},
          {"precision", c.precision},
          {"sequence_parallel", c.sequence_parallel},
          {"dropout", c.dropout},
          {"gpt",
           {{"layers", c.shape.layers},
            {"hidden", c.shape.hidden},
            {"heads", c.shape.heads},
            {"kv_heads", c.shape.kv_heads},
            {"ffn_hidden", c.shape.ffn_hidden},
            {"seq_len", c.shape.seq_len},
            {"vocab", c.shape.vocab},
            {"tie_head", c.shape.tie_head},
            {"rope_theta", c.shape.rope_theta},
            {"moe",
             {{"experts", c.shape.moe.experts},
              {"top_k", c.shape.moe.top_k},
              {"ffn", c.shape.moe.ffn},
              {"shared_ffn", c.shape.moe.shared_ffn},
              {"dense_layers", c.shape.moe.dense_layers},
              {"router", c.shape.moe.router},
              {"normalize", c.shape.moe.normalize},
              {"routed_scale", c.shape.moe.routed_scale},
              {"groups", c.shape.moe.groups},
              {"top_groups", c.shape.moe.top_groups},
              {"aux_loss", c.shape.moe.aux_loss},
              {"capacity_factor", c.shape.moe.capacity_factor}}}}},
          {"seed", c.seed},
          {"log_every", c.log_every},
          {"optimizer", c.optimizer.name},
          {"lr", c.optimizer.lr},
          {"momentum", c.optimizer.momentum},
          {"gpu_mem", c.gpu_mem},
          {"bucket_mb", c.bucket_mb},
          {"overlap", c.overlap},
          {"tp_comm_overlap", c.tp_comm_overlap},
          {"backend", c.backend},
          {"comm_timeout_s", c.comm_timeout_s},
          {"checkpoint_every", c.checkpoint_every},
          {"memory_snapshot", c.memory_snapshot},
          {"keep_checkpoints", c.keep_checkpoints},
          {"resume", c.resume},
          {"init_from", c.init_from},
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
      {"rope_theta", to(g.rope_theta)}, {"head_dim", to(g.head_dim)},
      {"qkv_bias", to(g.qkv_bias)},     {"out_bias", to(g.out_bias)},
      {"qk_norm", to(g.qk_norm)},       {"norm_eps", to(g.norm_eps)},
  };
  MoeShape& m = g.moe;
  const std::map<std::string, Setter> moe_setters = {
      {"experts", to(m.experts)},       {"top_k", to(m.top_k)},
      {"ffn", to(m.ffn)},               {"shared_ffn", to(m.shared_ffn)},
      {"dense_layers", to(m.dense_layers)}, {"router", to(m.router)},
      {"normalize", to(m.normalize)},   {"routed_scale", to(m.routed_scale)},
      {"groups", to(m.groups)},         {"top_groups", to(m.top_groups)},
      {"aux_loss", to(m.aux_loss)},     {"capacity_factor", to(m.capacity_factor)},
  };
  RopeScaling& r = g.rope_scaling;
  const std::map<std::string, Setter> rope_setters = {
      {"factor", to(r.factor)},
      {"low_freq_factor", to(r.low_freq_factor)},
      {"high_freq_factor", to(r.high_freq_factor)},
      {"original_max", to(r.original_max)},
      {"yarn", to(r.yarn)},
      {"beta_fast", to(r.beta_fast)},
      {"beta_slow", to(r.beta_slow)},
      {"mscale", to(r.mscale)},
      {"mscale_all_dim", to(r.mscale_all_dim)},
  };
  LatentShape& l = g.latent;
  const std::map<std::string, Setter> latent_setters = {
      {"q_rank", to(l.q_rank)},     {"kv_rank", to(l.kv_rank)}, {"nope_dim", to(l.nope_dim)},
      {"rope_dim", to(l.rope_dim)}, {"v_dim", to(l.v_dim)},     {"interleave", to(l.interleave)},
  };
  std::map<std::string, Setter> shape_setters = gpt_setters;
  shape_setters["rope_scaling"] = [&](const json& v, const std::string& k) {
    if (!v.is_object())
      wrong_type(k, v, "an object");
    apply(v, k + ".", rope_setters);
  };
  shape_setters["latent"] = [&](const json& v, const std::string& k) {
    if (!v.is_object())
      wrong_type(k, v, "an object");
    apply(v, k + ".", latent_setters);
  };
  shape_setters["moe"] = [&](const json& v, const std::string& k) {
    if (!v.is_object())
      wrong_type(k, v, "an object");
    apply(v, k + ".", moe_setters);
  };
  // Derived keys: to_json computes them from the others, so they are checked and dropped.
  const auto derived = [](const json& v, const std::string& k) { integer<int64_t>(v, k); };
  const std::map<std::string, Setter> setters = {
      {"gpus", to(c.gpus)},
      {"strategy", to(c.strategy)},
      {"model", to(c.model)},
      {"preset", to(c.preset)},
      {"hf_config", to(c.hf_config)},
      {"data", to(c.data)},
      {"device", to(c.device)},
      {"epochs", to(c.epochs)},
      {"max_steps", to(c.max_steps)},
      {"batch_size", to(c.batch_size)},
      {"global_batch_size", derived},
      {"tp", to(c.tp)},
      {"pp", to(c.pp)},
      {"dp", derived},
      {"cp", to(c.cp)},
      {"cp_comm", to(c.cp_comm)},
      {"ep", to(c.ep)},
      {"moe_dispatch", to(c.moe_dispatch)},
      {"loss_upcast", to(c.loss_upcast)},
      {"zero", to(c.zero)},
      {"dp_shard", to(c.dp_shard)},
      {"reshard_after_forward", to(c.reshard_after_forward)},
      {"reduce_fp32", to(c.reduce_fp32)},
      {"distributed_optimizer", to(c.distributed_optimizer)},
      {"pp_scatter_gather", to(c.pp_scatter_gather)},
      {"schedule", to(c.schedule)},
      {"virtual_stages", to(c.virtual_stages)},
      {"first_stage_layers", to(c.first_stage_layers)},
      {"last_stage_layers", to(c.last_stage_layers)},
      {"stage_layers", to(c.stage_layers)},
      {"micro_batches", to(c.micro_batches)},
      {"micro_batch_size", to(c.micro_batch_size)},
      {"recompute", to(c.recompute)},
      {"attention", to(c.attention)},
      {"elementwise", to(c.elementwise)},
      {"precision", to(c.precision)},
      {"sequence_parallel", to(c.sequence_parallel)},
      {"dropout", to(c.dropout)},
      {"gpt",
       [&](const json& v, const std::string& k) {
         if (!v.is_object())
           wrong_type(k, v, "an object");
         apply(v, k + ".", shape_setters);
       }},
      {"seed", to(c.seed)},
      {"log_every", to(c.log_every)},
      {"optimizer", to(c.optimizer.name)},
      {"lr", to(c.optimizer.lr)},
      {"momentum", to(c.optimizer.momentum)},
      {"gpu_mem", to(c.gpu_mem)},
      {"bucket_mb", to(c.bucket_mb)},
      {"overlap", to(c.overlap)},
      {"tp_comm_overlap", to(c.tp_comm_overlap)},
      {"backend", to(c.backend)},
      {"comm_timeout_s", to(c.comm_timeout_s)},
      {"checkpoint_every", to(c.checkpoint_every)},
      {"memory_snapshot", to(c.memory_snapshot)},
      {"keep_checkpoints", to(c.keep_checkpoints)},
      {"resume", to(c.resume)},
      {"init_from", to(c.init_from)},
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
