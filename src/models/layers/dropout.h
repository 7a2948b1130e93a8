// Dropout whose masks are a pure function of where an element is, not of a generator's
// state, so every layout draws the same bits: a mask element is decided by a counter-based
// hash (splitmix64 rounds in integer tensor ops) of the run's seed, the step, the layer, the
// site (the attention probabilities, the attention's output, the MLP's output) and the
// element's global coordinates: the sample's index in the step's global batch, the token's
// position in the whole sequence, the head, the key's position or the feature. A rank that
// holds some samples (data parallel), some heads (tensor parallel), part of the sequence
// (sequence or context parallel) or one micro-batch (pipeline) computes exactly the bits a
// single device computes for those elements, and a fused attention core can regenerate any
// tile of its mask in backward, as FlashAttention does from its Philox offsets.
//
// The strategy installs a DropoutDraw (the seed, the step, the micro-batch's sample indices
// and the tokens its residual stream holds) around each micro-batch's forward with a
// DropoutScope; activation checkpointing reinstalls the draw of the forward it recomputes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

namespace meshsim {

/// What one micro-batch's masks depend on besides each element's coordinates.
struct DropoutDraw {
  uint64_t seed = 0; // the run's --seed
  int64_t step = 0;  // the training step, from 1
  /// int64 [B]: each row's index in the step's global batch (the same sample gets the same
  /// index whichever rank holds it).
  torch::Tensor samples;
  /// int64 [T']: the whole-sequence positions of the tokens a block's residual stream holds on
  /// this rank (its 1/t part under sequence parallelism); undefined: 0..T'-1.
  torch::Tensor positions;
};

/// Installs `draw` as this thread's draw for the scope's lifetime (nullptr: none), restoring
/// the previous one after.
class DropoutScope {
public:
  explicit DropoutScope(std::shared_ptr<const DropoutDraw> draw);
  ~DropoutScope();
  DropoutScope(const DropoutScope&) = delete;
  DropoutScope& operator=(const DropoutScope&) = delete;

private:
  std::shared_ptr<const DropoutDraw> previous_;
};

/// This thread's draw; nullptr when none is installed.
std::shared_ptr<const DropoutDraw> current_dropout_draw();

/// Where in a layer a dropout sits (Megatron's attention_dropout and hidden_dropout).
enum class DropoutSite : int64_t { AttentionProbabilities = 1, AttentionOutput = 2, MlpOutput = 3 };

/// The keep mask, bool, of shape [n_0, n_1, ...] for the 1-D int64 coordinate tensors
/// `coordinates` = {c_0, c_1, ...} (element [i_0, i_1, ...] is at coordinates c_0[i_0],
/// c_1[i_1], ...): true with probability 1 - p, a pure function of (draw.seed, draw.step,
/// layer, site, the coordinates). Exactly: keep iff the top 53 bits of the hash are below
/// round((1 - p) · 2^53). On the meta device, an empty bool tensor of that shape (no values to
/// draw). The hash's scratch is not charged to the GPU (a GPU kernel draws in registers); the
/// mask is. Throws std::invalid_argument for p outside [0, 1) or a coordinate tensor that is
/// not 1-D int64.
torch::Tensor dropout_keep_mask(const DropoutDraw& draw, double p, int64_t layer,
                                DropoutSite site, const std::vector<torch::Tensor>& coordinates);

/// The keep mask of any tile of a layer's attention probabilities [B, heads, Tq, Tk], bool
/// [samples, heads, Tq, Tk]: `samples` int64 [B] the rows' indices in the global batch
/// (draw.samples, or a slice of it), heads first_head .. first_head + heads - 1 (global head
/// indices: under tensor parallelism member i holds heads i·H/t ..), `q_positions` [Tq] and
/// `k_positions` [Tk] the queries' and keys' whole-sequence positions. Any tile (rows
/// q_positions[i0:i1], columns k_positions[j0:j1]) holds exactly the bits of the same
/// elements of the whole mask, which is how a fused core regenerates its mask tile by tile in
/// backward. Masked (causal) elements get bits too; they multiply zeros.
torch::Tensor attention_dropout_keep(const DropoutDraw& draw, double p, int64_t layer,
                                     const torch::Tensor& samples, int64_t first_head,
                                     int64_t heads, const torch::Tensor& q_positions,
                                     const torch::Tensor& k_positions);

/// Dropout on one attention module's probabilities in training: its probability, its layer,
/// the global index of the first head it runs (tensor parallelism gives member i the heads
/// from i·heads/t), and the draw its masks come from (the attention module takes the
/// current one at forward, so that a fused core's backward, which runs after the draw's scope
/// has closed, regenerates the same tiles).
struct AttentionDropout {
  double p = 0;
  int64_t layer = 0;
  int64_t first_head = 0;
  std::shared_ptr<const DropoutDraw> draw; // nullptr: the current draw

  /// attention_dropout_keep of this module's `heads` heads for a batch of `batch` rows (the
  /// draw's samples) at these query and key positions: bool [batch, heads, Tq, Tk]. Throws
  /// std::logic_error when there is no draw or its samples are not `batch` rows.
  torch::Tensor keep(int64_t batch, int64_t heads, const torch::Tensor& q_positions,
                     const torch::Tensor& k_positions) const;
  /// Keeps this dropout in an autograd Function's context for its backward (saved_data under
  /// "dropout.*": the probability, the layer, the first head, the draw's seed, step and
  /// samples), and reads it back.
  void save(torch::autograd::AutogradContext* ctx) const;
  static AttentionDropout saved(torch::autograd::AutogradContext* ctx);
};

/// x · keep / (1 - p) (keep broadcast to x), keeping only the 1-byte mask for backward, as
/// PyTorch's native dropout does; the gradient is grad · keep / (1 - p).
torch::Tensor apply_dropout_mask(const torch::Tensor& x, const torch::Tensor& keep, double p);

/// Megatron's hidden dropout of a residual branch's output x [B, T', H] in training: the
/// current draw's samples and residual positions, every feature. Throws std::logic_error when
/// no draw is installed (a strategy that does not plumb dropout) or its sizes do not match x.
torch::Tensor hidden_dropout(const torch::Tensor& x, double p, int64_t layer, DropoutSite site);

/// The hash itself on scalars, for tests: the 64-bit value whose top 53 bits decide element
/// `coordinates` (as dropout_keep_mask hashes them).
uint64_t dropout_hash(const DropoutDraw& draw, int64_t layer, DropoutSite site,
                      const std::vector<int64_t>& coordinates);

} // namespace meshsim
