// Inside the Hugging Face format (hf_format.h): one row per family meshsim writes as a
// transformers architecture, and the reader of a config.json that a row checks against the run.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "models/models.h"

namespace meshsim {

/// Tensors by name, in order (a file's, or a model's parameters').
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// config.json read against a run: each check throws std::invalid_argument "WHERE KEY is GOT;
/// this run's FLAG is WANT" (or "...; WHY" for what meshsim's model fixes), and DataError for a
/// value of the wrong JSON type. A key left out takes transformers' default.
class ConfigReader {
public:
  ConfigReader(const nlohmann::json& doc, std::string where)
      : doc_(doc), where_(std::move(where)) {}

  /// A whole number the file must hold.
  int64_t integer(const std::string& key) const;
  void expect(const std::string& key, int64_t want, const std::string& flag) const;
  /// A whole number that may be null or absent, then `fallback`.
  void expect_or_null(const std::string& key, int64_t want, int64_t fallback,
                      const std::string& flag) const;
  void expect_bool(const std::string& key, bool want, bool fallback, const std::string& why) const;
  void expect_text(const std::string& key, const std::string& want, const std::string& fallback,
                   const std::string& why) const;
  void expect_number(const std::string& key, double want, double fallback,
                     const std::string& why) const;
  /// rope_parameters.rope_theta (transformers 5) or rope_theta (4.x), default 10000, with the
  /// default rope type and no rope scaling.
  void expect_rope_theta(double want) const;

private:
  [[noreturn]] void differs(const std::string& key, const std::string& got,
                            const std::string& tail) const;
  const nlohmann::json& doc_;
  std::string where_;
};

struct HfFamily {
  std::string model;        // meshsim's --model
  std::string architecture; // config.json's architectures[0]
  std::string model_type;   // config.json's model_type
  /// config.json for a shape whose ffn_hidden and kv_heads are resolved, weights in `dtype`
  /// ("float32").
  nlohmann::ordered_json (*config)(const TransformerShape& shape, const std::string& dtype);
  void (*check)(const ConfigReader& reader, const TransformerShape& shape);
  /// meshsim's whole parameters (by meshsim's names) as the file's tensors, in file order, and
  /// back. Both work on meta tensors too (names and shapes).
  NamedTensors (*to_hf)(const NamedTensors& meshsim, const TransformerShape& shape);
  NamedTensors (*from_hf)(const NamedTensors& hf, const TransformerShape& shape);
  /// Name endings of buffers some writers keep in the file, which carry no weights.
  std::vector<std::string> ignored;
};

const std::vector<HfFamily>& hf_families();
const HfFamily* find_hf_family(const std::string& model);

} // namespace meshsim
