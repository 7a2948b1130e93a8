// /api/plan's body, field by field, into `meshsim plan`'s flags.
#include "serve/plan_request.h"

#include <cctype>
#include <map>

#include <fmt/format.h>

#include "base/printable.h"
#include "models/presets.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& what) {
  throw RequestError(400, what);
}

// A field's name as an error quotes it: a key may hold anything JSON can write, newlines too.
std::string shown_key(const std::string& key) {
  return printable(key.size() > 64 ? key.substr(0, 64) + "..." : key);
}

// The JSON's own name of a value's type, as the error says it.
std::string type_name(const json& v) {
  return v.type_name();
}

// A value a flag takes as is: letters, digits and the few marks cluster and link names use.
std::string plain_text(const json& v, const std::string& field, size_t max_length) {
  if (!v.is_string())
    refuse(fmt::format("'{}' must be a string, not {}", field, type_name(v)));
  const std::string s = v.get<std::string>();
  if (s.empty() || s.size() > max_length)
    refuse(fmt::format("'{}' must be 1 to {} characters", field, max_length));
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_')
      refuse(fmt::format("'{}' may hold letters, digits, '-', '.' and '_' only", field));
  return s;
}

int64_t integer(const json& v, const std::string& field, int64_t min, int64_t max) {
  if (!v.is_number_integer())
    refuse(fmt::format("'{}' must be an integer, not {}", field,
                       v.is_number() ? "a fraction" : type_name(v)));
  // Unsigned JSON integers above int64's range read back as negative: compare both ways.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max))
    refuse(fmt::format("'{}' must be {} to {}", field, min, max));
  const int64_t n = v.get<int64_t>();
  if (n < min || n > max)
    refuse(fmt::format("'{}' must be {} to {}", field, min, max));
  return n;
}

bool boolean(const json& v, const std::string& field) {
  if (!v.is_boolean())
    refuse(fmt::format("'{}' must be true or false, not {}", field, type_name(v)));
  return v.get<bool>();
}

std::string one_of(const json& v, const std::string& field, std::initializer_list<const char*> ok) {
  const std::string s = plain_text(v, field, 32);
  std::string list;
  for (const char* o : ok) {
    if (s == o)
      return s;
    list += (list.empty() ? "" : ", ") + std::string(o);
  }
  refuse(fmt::format("'{}' must be one of {}, not '{}'", field, list, s));
}

constexpr int64_t kMaxDimension = 1 << 20; // beyond any cluster a plan covers

// The layout object: each key its flag.
void add_layout(const json& layout, std::vector<std::string>& out) {
  if (!layout.is_object())
    refuse(fmt::format("'layout' must be an object, not {}", type_name(layout)));
  struct IntegerField {
    const char* key;
    const char* flag;
    int64_t min, max;
  };
  static const IntegerField integers[] = {
      {"tp", "--tp", 1, kMaxDimension},
      {"pp", "--pp", 1, kMaxDimension},
      {"cp", "--cp", 1, kMaxDimension},
      {"ep", "--ep", 1, kMaxDimension},
      {"dp_shard", "--dp-shard", 1, kMaxDimension},
      {"zero", "--zero", 0, 3},
      {"micro_batch_size", "--micro-batch-size", 1, kMaxDimension},
      {"micro_batches", "--micro-batches", 1, kMaxDimension},
      {"virtual_stages", "--virtual-stages", 1, 1024},
  };
  // Checked in the body's order, written in the order `meshsim plan --help` lists them.
  static const char* const order[] = {"tp",
                                      "pp",
                                      "cp",
                                      "cp_comm",
                                      "ep",
                                      "moe_dispatch",
                                      "dp_shard",
                                      "zero",
                                      "virtual_stages",
                                      "micro_batches",
                                      "micro_batch_size",
                                      "recompute",
                                      "attention",
                                      "elementwise",
                                      "sequence_parallel",
                                      "tp_comm_overlap",
                                      "loss_upcast"};
  std::map<std::string, std::vector<std::string>> by_key;
  for (const auto& [key, value] : layout.items()) {
    std::vector<std::string>& flags = by_key[key];
    const IntegerField* field = nullptr;
    for (const IntegerField& f : integers)
      if (key == f.key)
        field = &f;
    const std::string name = "layout." + key;
    if (field) {
      flags.push_back(field->flag);
      flags.push_back(std::to_string(integer(value, name, field->min, field->max)));
    } else if (key == "recompute") {
      flags.push_back("--recompute");
      flags.push_back(one_of(value, name, {"none", "selective", "op", "full"}));
    } else if (key == "attention") {
      flags.push_back("--attention");
      flags.push_back(one_of(value, name, {"fused", "eager"}));
    } else if (key == "elementwise") {
      flags.push_back("--elementwise");
      flags.push_back(one_of(value, name, {"fused", "eager"}));
    } else if (key == "cp_comm") {
      flags.push_back("--cp-comm");
      flags.push_back(one_of(value, name, {"allgather", "ring"}));
    } else if (key == "moe_dispatch") {
      flags.push_back("--moe-dispatch");
      flags.push_back(one_of(value, name, {"deepep", "alltoall"}));
    } else if (key == "sequence_parallel") {
      if (boolean(value, name))
        flags.push_back("--sequence-parallel");
    } else if (key == "tp_comm_overlap") {
      if (boolean(value, name))
        flags.push_back("--tp-comm-overlap");
    } else if (key == "loss_upcast") {
      if (!boolean(value, name))
        flags.push_back("--no-loss-upcast");
    } else {
      refuse(fmt::format("unknown field '{}' (layout takes tp, pp, cp, ep, dp_shard, zero, "
                         "micro_batch_size, micro_batches, virtual_stages, recompute, attention, "
                         "elementwise, cp_comm, moe_dispatch, sequence_parallel, tp_comm_overlap, "
                         "loss_upcast)",
                         shown_key(name)));
    }
  }
  for (const char* key : order)
    if (auto it = by_key.find(key); it != by_key.end())
      out.insert(out.end(), it->second.begin(), it->second.end());
}

// How deep arrays and objects nest in `text` (outside its strings): checked before parsing,
// since writing a value back out recurses once a level.
int nesting(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

constexpr int kMaxNesting = 32; // a config.json nests 3 or 4 deep

} // namespace

PlanRequest parse_plan_request(const std::string& body) {
  if (nesting(body) > kMaxNesting)
    refuse(fmt::format("the body nests arrays and objects over {} deep", kMaxNesting));
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    refuse("the body is not JSON (send one object, e.g. {\"preset\": \"llama3-8b\", "
           "\"cluster\": \"8xh100\"})");
  if (!doc.is_object())
    refuse(fmt::format("the body must be a JSON object, not {}", type_name(doc)));
  PlanRequest r;
  // Checked in the body's order, written as a person would type them.
  static const char* const order[] = {"preset",    "cluster",           "intra",   "inter",
                                      "precision", "global_batch_size", "seq_len", "layout"};
  std::map<std::string, std::vector<std::string>> by_key;
  bool has_model = false, has_cluster = false;
  int64_t top = -1;
  for (const auto& [key, value] : doc.items()) {
    std::vector<std::string>& flags = by_key[key];
    if (key == "preset") {
      const std::string name = plain_text(value, key, 64);
      if (!find_preset(name))
        refuse(fmt::format("unknown preset '{}' (GET /api/options lists them)", name));
      if (has_model)
        refuse("give 'preset' or 'hf_config', not both");
      has_model = true;
      flags.insert(flags.end(), {"--preset", name});
    } else if (key == "hf_config") {
      if (!value.is_object())
        refuse(fmt::format("'hf_config' must be a config.json's object, not {}", type_name(value)));
      if (value.dump(-1, ' ', false, json::error_handler_t::replace).size() > kMaxHfConfigBytes)
        refuse(fmt::format("'hf_config' is over {} KiB", kMaxHfConfigBytes / 1024));
      if (has_model)
        refuse("give 'preset' or 'hf_config', not both");
      has_model = true;
      r.hf_config = value;
    } else if (key == "cluster") {
      has_cluster = true;
      flags.insert(flags.end(), {"--cluster", plain_text(value, key, 64)});
    } else if (key == "intra" || key == "inter") {
      flags.insert(flags.end(), {"--" + key, plain_text(value, key, 64)});
    } else if (key == "precision") {
      flags.insert(flags.end(),
                   {"--precision", one_of(value, key, {"fp32", "bf16", "fp16", "fp8"})});
    } else if (key == "layout") {
      add_layout(value, flags);
    } else if (key == "global_batch_size") {
      flags.insert(flags.end(), {"--global-batch-size",
                                 std::to_string(integer(value, key, 1, int64_t{1} << 24))});
    } else if (key == "seq_len") {
      flags.insert(flags.end(),
                   {"--seq-len", std::to_string(integer(value, key, 1, int64_t{1} << 24))});
    } else if (key == "search") {
      r.search = boolean(value, key);
    } else if (key == "top") {
      top = integer(value, key, 1, 100);
    } else {
      refuse(fmt::format("unknown field '{}' (a plan takes preset or hf_config, cluster, intra, "
                         "inter, precision, layout, global_batch_size, seq_len, search, top)",
                         shown_key(key)));
    }
  }
  for (const char* key : order)
    if (auto it = by_key.find(key); it != by_key.end())
      r.flags.insert(r.flags.end(), it->second.begin(), it->second.end());
  std::vector<std::string>& flags = r.flags;
  if (!has_model)
    refuse("give a model: 'preset' (GET /api/options lists them) or 'hf_config' (a config.json)");
  if (!has_cluster)
    refuse("give a 'cluster', e.g. \"8xh100\" or \"4x8xh100\"");
  if (r.search) {
    flags.push_back("--search");
    if (top > 0)
      flags.insert(flags.end(), {"--top", std::to_string(top)});
  } else if (top > 0) {
    refuse("'top' ranks a search's layouts: give \"search\": true");
  }
  return r;
}

std::string PlanRequest::command_line() const {
  std::string line = "meshsim plan";
  if (hf_config.is_object())
    line += " --hf-config config.json";
  for (const std::string& f : flags)
    line += " " + f;
  return line;
}

} // namespace meshsim
