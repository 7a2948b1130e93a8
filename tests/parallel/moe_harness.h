// The tiny mixture-of-experts Llama the data- and expert-parallel tests train against one GPU:
// 4 experts, top 2, shared experts, a dense first layer; float64, SGD with momentum, 10 steps
// of a global batch of 8 on the same synthetic text.
#pragma once

#include <memory>
#include <vector>

#include "data/text.h"
#include "strategy_harness.h"

namespace meshsim::testing {

constexpr int kTinyMoeSteps = 10;
constexpr int64_t kTinyMoeGlobalBatch = 8;

inline StrategyOptions tiny_moe_llama(int64_t layers, double aux_loss) {
  StrategyOptions o;
  o.model = "llama";
  o.seed = 17;
  o.shape.layers = layers;
  o.shape.hidden = 16;
  o.shape.heads = 4;
  o.shape.kv_heads = 2;
  o.shape.ffn_hidden = 32;
  o.shape.seq_len = 16;
  o.shape.vocab = 64;
  o.shape.moe.experts = 4;
  o.shape.moe.top_k = 2;
  o.shape.moe.ffn = 16;
  o.shape.moe.shared_ffn = 8;
  o.shape.moe.dense_layers = 1;
  o.shape.moe.aux_loss = aux_loss;
  o.optimizer.name = "sgd";
  o.optimizer.lr = 0.1;
  o.optimizer.momentum = 0.9;
  o.dtype = torch::kFloat64;
  return o;
}

/// `options` trained on `world` GPUs ("single" on one, "ddp" and its layouts on more).
inline HarnessRun run_tiny_moe(int world, const StrategyOptions& options) {
  static std::vector<std::unique_ptr<DeviceMesh>> meshes; // outlive the returned runs
  meshes.push_back(std::make_unique<DeviceMesh>(mesh_options(world, int64_t{1} << 30)));
  torch::manual_seed(5); // the same permutation of the data for every run
  static const Dataset data = synthetic_text(256, 16, 16, 64, 7).train;
  return run_strategy(*meshes.back(), world == 1 ? "single" : "ddp", options, data,
                      kTinyMoeGlobalBatch, kTinyMoeSteps);
}

} // namespace meshsim::testing
