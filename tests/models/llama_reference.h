// The Llama against PyTorch (tests/models/reference_llama.py): the same init, float64, fixed
// tokens; the parameter count, the loss, every logit and every gradient compared. Used by the
// dense Llama's test and the mixture of experts' (whose shape's moe part the script takes too).
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "models/llama.h"
#include "parallel/strategy.h"
#include "../python_torch.h"

namespace meshsim::testing {

// Both sides run the same float64 operations, in possibly different summation orders (the
// kernels differ: ATen's CPU capabilities, MKL). A dot product of length n is exact to
// n·u relative to its absolute terms, u = 1.1e-16; the longest here are 256 (the MLP's
// width), so 2.8e-14 per operation. Forward is ~30 such operations deep (two blocks of
// norm, q/k/v, scores, softmax, AV, o, gate/up, down, then norm_f and the head; an MoE layer
// adds its router and two weighted expert outputs), backward twice that: ~2e-12 relative at
// worst. 1e-10 keeps a margin of 50 and is still eight orders below a real mistake (a wrong
// rotary half, kv grouping or expert moves logits by percent).
constexpr double kFloat64ModelTolerance = 1e-10;

/// Tokens [batch, t]: (a·b + c·i + d) mod vocab, as reference_llama.py makes them.
inline torch::Tensor fixed_tokens(int64_t batch, int64_t t, int64_t vocab, int64_t a, int64_t c,
                                  int64_t d) {
  torch::Tensor out = torch::empty({batch, t}, torch::kLong);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < t; ++i)
      out[b][i] = (a * b + c * i + d) % vocab;
  return out;
}

/// Runs reference_llama.py for `o` (with its mixture of experts, if it has one): parameter
/// count, loss, every logit, every gradient.
inline std::vector<double> python_llama_reference(const TransformerShape& o, int seed,
                                                  int64_t batch, int64_t t) {
  std::string cmd =
      MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR "/tests/models/reference_llama.py " +
      std::to_string(o.layers) + " " + std::to_string(o.hidden) + " " + std::to_string(o.heads) +
      " " + std::to_string(llama_kv_heads(o)) + " " + std::to_string(llama_ffn_hidden(o)) + " " +
      std::to_string(o.seq_len) + " " + std::to_string(o.vocab) + " " +
      std::to_string(o.rope_theta) + " " + std::to_string(seed) + " " + std::to_string(batch) +
      " " + std::to_string(t);
  if (o.moe.experts > 0)
    cmd += " " + std::to_string(o.moe.experts) + " " + std::to_string(o.moe.top_k) + " " +
           std::to_string(llama_moe_options(o).expert_ffn) + " " +
           std::to_string(o.moe.shared_ffn) + " " + std::to_string(o.moe.dense_layers) + " " +
           std::to_string(o.moe.aux_loss);
  // The Hugging Face variants (models/hf_config.h), in the script's flags.
  const auto exact = [](double x) { return fmt::format("{:.17g}", x); };
  if (o.head_dim > 0)
    cmd += " --head-dim " + std::to_string(o.head_dim);
  if (o.qkv_bias)
    cmd += " --qkv-bias";
  if (o.out_bias)
    cmd += " --out-bias";
  if (o.qk_norm)
    cmd += " --qk-norm";
  if (o.norm_eps != TransformerShape{}.norm_eps)
    cmd += " --eps " + exact(o.norm_eps);
  if (o.rope_scaling.factor > 0)
    cmd += " --llama3 " + exact(o.rope_scaling.factor) + " " +
           exact(o.rope_scaling.low_freq_factor) + " " + exact(o.rope_scaling.high_freq_factor) +
           " " + std::to_string(o.rope_scaling.original_max);
  if (o.tie_head)
    cmd += " --tie";
  if (o.moe.experts > 0 && !o.moe.normalize)
    cmd += " --no-normalize";
  return numbers_printed_by(cmd);
}

inline double norm_relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

/// The worst relative errors of one comparison.
struct PyTorchComparison {
  double loss = 0, logit_error = 0, grad_error = 0;
};

/// Builds the Llama of `o` in float64 (seed 3), runs batch 2 of 12 fixed tokens forward and
/// backward, and expects the count, the loss, the logits and every gradient to match
/// reference_llama.py's within kFloat64ModelTolerance; `what` names the case in failures.
/// Expects meshsim's `loss`, `logits` and the gradients of `params` (in order) to match what a
/// reference script printed from `expected[first]` on: the loss, every logit, every gradient,
/// each within `tolerance` relative; `what` names the case in failures.
inline PyTorchComparison expect_matches_printed(const std::vector<double>& expected, size_t first,
                                                const torch::Tensor& loss,
                                                const torch::Tensor& logits,
                                                const std::vector<torch::Tensor>& params,
                                                double tolerance, const std::string& what) {
  PyTorchComparison out;
  size_t count = first + 1 + static_cast<size_t>(logits.numel());
  for (const auto& p : params)
    count += static_cast<size_t>(p.numel());
  EXPECT_EQ(expected.size(), count) << what;
  if (expected.size() != count)
    return out;
  const auto reference = [&](size_t offset, int64_t n) {
    return torch::tensor(std::vector<double>(expected.begin() + static_cast<long>(offset),
                                             expected.begin() + static_cast<long>(offset + n)),
                         torch::kFloat64);
  };
  out.loss = loss.item<double>();
  EXPECT_NEAR(out.loss, expected[first], tolerance * expected[first]) << what;
  out.logit_error =
      norm_relative_error(logits.detach().reshape(-1), reference(first + 1, logits.numel()));
  EXPECT_LT(out.logit_error, tolerance) << what;
  size_t offset = first + 1 + static_cast<size_t>(logits.numel());
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    const double e = norm_relative_error(p.grad().reshape(-1), reference(offset, p.numel()));
    EXPECT_LT(e, tolerance) << what << " parameter " << i << " of " << p.sizes();
    out.grad_error = std::max(out.grad_error, e);
    offset += static_cast<size_t>(p.numel());
  }
  return out;
}

inline PyTorchComparison expect_llama_matches_pytorch(const TransformerShape& o,
                                                      const std::string& what) {
  const int64_t batch = 2, t = 12; // T < seq_len
  const auto expected = python_llama_reference(o, 3, batch, t);
  ModelOptions mo{3, 0, o, torch::kFloat64};
  auto model = build_model("llama", mo);
  if (!expected.empty()) {
    EXPECT_EQ(count_parameters(*model), static_cast<int64_t>(expected[0])) << what;
  }
  const torch::Tensor logits = model->forward(fixed_tokens(batch, t, o.vocab, 7, 13, 3));
  const torch::Tensor loss = loss_fn(logits, fixed_tokens(batch, t, o.vocab, 5, 11, 1));
  loss.backward();
  // The script prints the parameter count first, then the loss.
  return expect_matches_printed(expected, 1, loss, logits, unique_parameters(*model),
                                kFloat64ModelTolerance, what);
}

} // namespace meshsim::testing
