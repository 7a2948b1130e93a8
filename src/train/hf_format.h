// The Hugging Face format of meshsim's transformers: a folder with config.json and
// model.safetensors that `transformers`' AutoModelForCausalLM.from_pretrained loads. The GPT is
// GPT-2 (GPT2LMHeadModel: Conv1D weights stored [in, out], q, k and v fused into c_attn, the
// exact GELU, LayerNorm eps 1e-5, the head tied as the run ties it); the Llama is
// LlamaForCausalLM (the names map one to one: reference_llama.py computes as it does).
// Written by `meshsim export RUN --hf DIR` from the gathered model (train/export.h), read by
// `meshsim train --init-from DIR`, which every layout builds its parts from.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"
#include "train/export.h"

namespace meshsim {

/// The Hugging Face architecture `model` is written as ("GPT2LMHeadModel"), or "" when it has
/// none (the image nets).
std::string hf_architecture(const std::string& model);

struct HfFolder {
  std::string config_json; // config.json's text
  std::string safetensors; // model.safetensors' bytes
  int64_t tensors = 0;     // in the file (a tied head is one)
};

/// `model` (gathered by export_model from a run of `config`) in the Hugging Face format. The
/// same model gives the same bytes. Throws std::invalid_argument for a model without one.
HfFolder hf_folder(const TrainConfig& config, const ExportedModel& model);

/// Writes `folder` into `dir` (made when missing; its parent must exist), each file
/// atomically.
void write_hf_folder(const std::filesystem::path& dir, const HfFolder& folder);

/// Checks, before anything trains and without reading the weights, that `dir` holds a model
/// a run of `config` can start from: its config.json describes the run's architecture and
/// shape, and model.safetensors' header lists exactly the tensors that model has, each of its
/// shape in a floating-point dtype. Throws std::invalid_argument (one line, naming the field or
/// tensor and the flag it disagrees with) or DataError (a malformed file).
void check_hf_folder(const TrainConfig& config, const std::filesystem::path& dir);

/// The weights of `dir` (checked as above) as meshsim's whole parameters, by meshsim's
/// parameter names ("block0.attn.q.weight"), in the file's dtype, on the CPU.
std::vector<std::pair<std::string, torch::Tensor>>
read_hf_weights(const TrainConfig& config, const std::filesystem::path& dir);

} // namespace meshsim
