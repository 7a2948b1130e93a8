// Megatron's vocab-parallel cross-entropy: the loss of logits left split over the vocabulary
// by the tensor-parallel head (VocabParallelHead with parallel_output), computed without
// gathering them. See docs/tensor-parallel.md.
#pragma once

#include <torch/torch.h>

#include "comm/communicator.h"
#include "models/layers/flops.h"

namespace meshsim {

/// The mean over tokens of −log softmax(logits)[target], where `logits` ([..., V/n], any
/// leading shape matching `targets`') are member `index`'s slice of the vocabulary, the
/// columns [index·V/n, (index+1)·V/n) of the whole logits, over `group` of n members. As
/// Megatron computes it: 16-bit logits cast to fp32; the rows' max all-reduced (max) over the
/// group and subtracted; the target's logit taken by the member whose slice holds it and the
/// sum of exps, each all-reduced (sum); the loss log(sum) − that logit. Backward is
/// softmax − one-hot on the slice, kept from forward (one [N, V/n] fp32 tensor, overwritten in
/// place), with no collective. Every member returns the same loss; each backpropagates its
/// slice's share. Collective: every member of `group` calls it.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, Communicator& comm,
                                           const Group& group, int index);

/// The kernels vocab_parallel_cross_entropy runs on `tokens` rows of a `width`-column slice of
/// `elem_bytes` logits: forward (the cast, the max, the shift, exp, the sum, the division into
/// the softmax kept for backward, and the small kernels over the tokens) and backward (the
/// one-hot subtracted, the product with the loss's gradient, the cast back).
LossWork vocab_parallel_cross_entropy_work(double tokens, double width, double elem_bytes);

} // namespace meshsim
