// A mixture of experts as a block's feed-forward (FeedForward, mlp.h): a router scores each
// token against E routed experts and sends it to its top k; each routed expert is a SwiGLU MLP
// of its own width, the E of them stored stacked ([E, F, H] gate and up, [E, H, F] down) so
// that expert parallelism can give each rank a slice; optional shared experts (one SwiGLU that
// every token passes, DeepSeek's and Qwen2-MoE's) add to the routed output.
//
// Routers:
//  - softmax (Mixtral, Qwen3-MoE): p = softmax(logits) in float32; the top k of p, their
//    weights optionally renormalised to sum to 1;
//  - sigmoid (DeepSeek-V3): s = sigmoid(logits); experts chosen by s + bias (a per-expert
//    bias that only steers the choice), optionally only within the best `top_groups` of
//    `groups` groups of experts (a group scored by the sum of its two best s + bias); the
//    weights are the chosen s, optionally renormalised, times `routed_scale`.
//
// Dropless by default: every chosen expert runs every token sent to it. With a capacity factor
// C, each expert takes at most ceil(C·N·k/E) of the N·k assignments of a forward's N tokens,
// in token order (GShard's priority); the others are dropped (their weight becomes 0).
//
// The load-balancing loss is Switch's α·E·Σ_e f_e·P_e (f_e the fraction of the router's
// choices that went to expert e, P_e the mean router probability of e), taken per sequence and
// averaged over the batch's sequences, so that any split of the batch over replicas sums to the
// same loss, as the language-model loss does. It reaches the router through autograd: the
// layer's output carries it, and its backward adds d loss / d aux, the factor the strategy
// multiplies the language-model loss by before backward (1, or a loss scale; MoeLossScale), as
// Megatron's MoEAuxLossAutoScaler does. When a rank holds only part of each sequence (context
// parallelism), the sequence's counts are summed over the parts (MoeSequenceParts) so that
// the loss is the whole sequence's.
//
// Where the experts run is a slot (ExpertDispatch): by default all E on this rank; expert
// parallelism (parallel/expert/) keeps a slice of them on each rank of an ep group and sends
// each token, once, to every rank holding any of its experts, and the weighted sum of those
// experts' outputs back (all_to_all).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/layers/flops.h"
#include "models/layers/mlp.h"

namespace meshsim {

enum class MoeRouter { Softmax, Sigmoid };

/// "softmax" | "sigmoid" (--moe-router). Throws std::invalid_argument for another name.
MoeRouter parse_moe_router(const std::string& name);
std::string to_string(MoeRouter router);

struct MoeOptions {
  int64_t hidden = 0;
  int64_t experts = 0;     // routed experts, E
  int64_t top_k = 0;       // experts per token, k
  int64_t expert_ffn = 0;  // each routed expert's SwiGLU width, F
  int64_t shared_ffn = 0;  // the shared experts' total width (one SwiGLU); 0: none
  MoeRouter router = MoeRouter::Softmax;
  bool normalize_top_k = true;  // the chosen weights sum to 1 (before routed_scale)
  double routed_scale = 1;      // the routed output's factor (DeepSeek's routed_scaling_factor)
  int64_t groups = 1, top_groups = 1;  // group-limited routing (sigmoid router)
  double aux_loss = 0;          // Switch's α; 0: no load-balancing loss
  double capacity_factor = 0;   // 0: dropless
  /// On meta tensors (plans), which have no values to route: each expert's share of the N·k
  /// assignments (summing to 1); empty: k·N/E each. The experts, their rows and the exchange
  /// of expert parallelism then have the shapes this routing gives.
  std::vector<double> planned_shares;
};

/// The assignments each of E experts gets of `assignments` under `shares` (empty: equal):
/// the largest-remainder rounding of assignments · share, so they sum to `assignments`.
std::vector<int64_t> planned_counts(const std::vector<double>& shares, int64_t experts,
                                    int64_t assignments);

/// The choice of N tokens: experts int64 [N, k], weights [N, k] (float32 for 16-bit logits,
/// the logits' dtype otherwise), and the router probabilities [N, E] the balancing loss reads
/// (softmax p, or the sigmoid scores normalised to sum to 1 per token).
struct MoeRouting {
  torch::Tensor experts, weights, probabilities;
};

/// Routes router logits [N, E] as `options` says; `bias` [E] steers the sigmoid router's
/// choice (undefined: none). Differentiable in the logits through weights and probabilities.
MoeRouting route_tokens(const torch::Tensor& logits, const MoeOptions& options,
                        const torch::Tensor& bias = {});

/// Which of the assignments experts [N, k] an expert with room for `capacity` of them keeps:
/// bool [N, k], each expert keeping its first `capacity` assignments in token order (and, for
/// one token, in the order of its choices).
torch::Tensor capacity_keep(const torch::Tensor& experts, int64_t num_experts, int64_t capacity);

/// ceil(factor · tokens · k / E): an expert's capacity under a capacity factor.
int64_t expert_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts);


/// Under context parallelism a rank holds `parts` pieces of every sequence, one per rank of a
/// group; `sum` adds a tensor over those ranks in place (not differentiated: the balancing
/// loss's counts).
struct MoeSequenceParts {
  int parts = 1;
  std::function<void(torch::Tensor&)> sum;
};

/// Switch's balancing loss of one forward: α·E·Σ_e f_e·P_e per sequence of `sequence_length`
/// tokens, averaged over the sequences (see the top). `experts` [N, k] the router's choices,
/// `probabilities` [N, E]; N a multiple of sequence_length. Differentiable in probabilities.
/// With `split` of parts p > 1, the N tokens are this rank's 1/p of each sequence: f is the
/// whole sequence's (counts summed over the parts), P this part's sum over the whole
/// sequence's length, and the loss is multiplied by p, so that the parts' average (the
/// gradients' average over the cp group) is the whole sequences' loss.
torch::Tensor balancing_loss(const torch::Tensor& experts, const torch::Tensor& probabilities,
                             int64_t num_experts, int64_t sequence_length, double alpha,
                             const MoeSequenceParts& split = {});

class MoeImpl;

/// The assignments of a forward that run, grouped by expert in expert order: `token_of`
/// (int64 [n]) the token of each, `weights` [n] its weight (undefined: each output as it is,
/// to be weighted elsewhere), `counts` (int64 [E], on the host) how many each expert has.
struct MoeAssignments {
  torch::Tensor token_of, weights, counts;
};

/// Where a layer's routed experts run. Returns the routed output [N, H] of `tokens` [N, H]:
/// each token's sum, over its assignments, of the expert's output times the weight.
class ExpertDispatch {
public:
  virtual ~ExpertDispatch() = default;
  virtual torch::Tensor run(MoeImpl& layer, const torch::Tensor& tokens,
                            const MoeAssignments& assignments) = 0;
  /// The memory-bound kernels the last run() ran at the source, beside the layer's own
  /// (MoeImpl::add_routed_work); `element_bytes` the activations' width.
  virtual void add_source_work(LayerWork& /*total*/, double /*element_bytes*/) const {}
};

/// Under the planned routing (`options.planned_shares`; k distinct experts a token, equally
/// likely in proportion to their shares, within the kept groups of group-limited routing),
/// the fraction of tokens with at least one choice among experts first .. first + count - 1:
/// those expert parallelism sends, once each, to the rank holding them.
double planned_reach(const MoeOptions& options, int64_t first, int64_t count);

class MoeImpl : public FeedForward, public RoutedWork {
public:
  explicit MoeImpl(const MoeOptions& options, const torch::TensorOptions& tensors = {});
  /// x [B, T, H] -> [B, T, H].
  torch::Tensor forward(const torch::Tensor& x) override;
  const MoeOptions& options() const { return options_; }
  /// Assignments this rank's tokens sent to each expert in the last forward (after capacity),
  /// int64 [E] on the host.
  const torch::Tensor& tokens_per_expert() const { return tokens_per_expert_; }
  /// Rows each of this rank's experts ran in the last forward (from every rank of its ep
  /// group), int64 [local experts] on the host.
  const torch::Tensor& expert_load() const { return expert_load_; }
  void add_routed_work(LayerWork& total, double element_bytes) const override;

  /// Keeps experts first .. first + count - 1 of the E (their slices of the stacked weights
  /// become the parameters, in the same places) and runs them through `dispatch`. Expert
  /// parallelism's, once, before the layer is trained.
  void keep_experts(int64_t first, int64_t count, std::shared_ptr<ExpertDispatch> dispatch);
  int64_t first_expert() const { return first_expert_; }
  int64_t local_experts() const { return expert_gate.size(0); }
  /// Runs this rank's experts: `rows` [n, H] grouped by local expert, `counts` (int64, on the
  /// host) how many rows each of them has. Returns their outputs [n, H] in the same order.
  torch::Tensor run_local_experts(const torch::Tensor& rows, const torch::Tensor& counts);
  /// Runs this rank's experts on `assignments` of `rows` [R, H] (their counts: this rank's
  /// experts'). Returns [R, H]: each row's sum of its experts' outputs, weighted.
  torch::Tensor run_assignments(const torch::Tensor& rows, const MoeAssignments& assignments);
  /// Context parallelism: the balancing loss sums its counts over the sequence's parts.
  void split_sequences(MoeSequenceParts parts) { sequence_parts_ = std::move(parts); }

  torch::Tensor router, expert_gate, expert_up, expert_down;  // [E,H], [E,F,H] ×2, [E,H,F]
  torch::Tensor router_bias;  // buffer [E]: the sigmoid router's steering bias (zeros)

private:
  MoeOptions options_;
  std::shared_ptr<SwiGluMlpImpl> shared_;
  std::shared_ptr<ExpertDispatch> dispatch_;  // null: every expert here
  MoeSequenceParts sequence_parts_;
  int64_t first_expert_ = 0;
  torch::Tensor tokens_per_expert_;  // [E]: the router's choices for this rank's tokens
  torch::Tensor expert_load_;        // [local experts]: the rows this rank's experts ran
  int64_t last_tokens_ = 0;
  int64_t last_rows_ = 0;            // the rows run_assignments last had (tokens, or arrivals)
};
TORCH_MODULE(Moe);

/// The factor the language-model loss is multiplied by before this thread's backwards (a loss
/// scale), which the balancing loss's gradient takes too; a layer reads it at forward. 1
/// outside a scope.
class MoeLossScale {
public:
  explicit MoeLossScale(double scale);
  ~MoeLossScale();
  MoeLossScale(const MoeLossScale&) = delete;
  MoeLossScale& operator=(const MoeLossScale&) = delete;
  static double current();

private:
  double previous_;
};

/// Parameters of one MoE layer: router E·H, routed experts 3·E·H·F, shared experts 3·H·F_s.
int64_t moe_parameter_count(const MoeOptions& options);

} // namespace meshsim
