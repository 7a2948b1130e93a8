// Rotary position embedding (Su et al. 2021) at explicit positions, so that a rank holding
// non-contiguous chunks of the sequence (context parallelism) rotates each token by its own
// position rather than by its index in the chunk.
#pragma once

#include <torch/torch.h>

#include "models/models.h"

namespace meshsim {

/// Rotary position embedding of x [B, heads, T, head_dim] for the tokens at `positions`
/// (int64 [T]), rotating the two halves of each head (rotate_half, as Hugging Face's and
/// Meta's Llama do): x·cos + rotate_half(x)·sin with angle position · theta^(-2i/head_dim),
/// the frequencies theta^(-2i/head_dim) scaled as `scaling` says (Llama 3.1's rule or YaRN's,
/// models.h; factor 0: unscaled), cos and sin times rope_attention_factor. `interleaved`: x's
/// pairs are adjacent features (DeepSeek's rope_interleave); the result is then in the halves'
/// layout, evens first (the same for q and k, so their products are unchanged).
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta,
                           const RopeScaling& scaling = {}, bool interleaved = false);

/// YaRN's factor on cos and sin (1 for any other scaling).
double rope_attention_factor(const RopeScaling& scaling);

/// YaRN's factor on the softmax's scale in multi-head latent attention, mscale(factor,
/// mscale_all_dim)² (1 without mscale_all_dim or for any other scaling), as DeepSeek-V3's.
double rope_softmax_factor(const RopeScaling& scaling);

/// torch::arange(start, end, step, options), in a tensor allocated at its final size first.
/// arange fills an empty tensor and resizes it; LibTorch 2.x resizes a meta tensor's storage
/// without asking its allocator (resize_bytes_meta only sets its size), so a plan would not
/// charge it, while the same arange on a real device allocates: the plan and the run it
/// predicts would disagree by these bytes.
torch::Tensor arange_allocated(int64_t start, int64_t end, int64_t step,
                               const torch::TensorOptions& options);

} // namespace meshsim
