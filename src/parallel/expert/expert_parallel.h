// Expert parallelism (--ep E): the routed experts of every mixture-of-experts layer
// (models/layers/moe.h) are split over the ranks of an ep group, rank i of it keeping experts
// i·E/ep .. (i+1)·E/ep - 1; everything else (attention, the router, shared experts, dense
// layers) stays whole on every rank. Each rank routes its own tokens; then, per layer:
//
//   1. counts: every rank tells every other how many of its rows go to each of that rank's
//      experts (an all_to_all of E numbers);
//   2. dispatch: the rows go to the ranks that hold their experts (all_to_all with those
//      splits), arriving grouped by source rank, then by expert; they are regrouped by
//      expert and each local expert runs its rows from every source, in source order;
//   3. combine: the outputs go back the way they came (all_to_all with the splits swapped),
//      and the source weights them and adds them to its tokens.
//
// Backward runs the two exchanges in reverse (the gradients of the combined rows to the
// experts, then of the dispatched rows back to their tokens). The experts' gradients are then
// those of every token of the ep group that reached them; the ranks that hold the same
// experts (the "edp" group, mesh/parallel_dims.h) reduce them, scaled by 1/ep, so that they
// are averaged over dp × cp as the dense gradients are. See docs/moe.md.
#pragma once

#include <cstddef>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

/// Splits the routed experts of every MoE layer of `model` over `ep` (this rank is member
/// `index`): each keeps its slice and exchanges tokens with the group. std::invalid_argument
/// when a layer's experts do not divide by the group's size.
void parallelize_experts(torch::nn::Sequential& model, Communicator& comm, const Group& ep);

/// Context parallelism: every MoE layer's balancing loss sums its per-sequence counts over
/// `cp`, whose ranks hold the parts of each sequence.
void split_moe_sequences(torch::nn::Sequential& model, Communicator& comm, const Group& cp);

/// Indices into model->parameters() of the routed experts' weights (the stacked gate, up and
/// down of every MoE layer).
std::vector<size_t> expert_parameter_indices(const torch::nn::Sequential& model);

/// Collective over `ep`: each of `params` (an expert slice, [E/ep, ...]) gathered whole over
/// the group along dim 0, in the group's order.
std::vector<torch::Tensor> gather_experts(const std::vector<torch::Tensor>& params,
                                          Communicator& comm, const Group& ep);

} // namespace meshsim
