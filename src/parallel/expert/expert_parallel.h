// Expert parallelism (--ep E): the routed experts of every mixture-of-experts layer
// (models/layers/moe.h) are split over the ranks of an ep group, rank i of it keeping experts
// i·E/ep .. (i+1)·E/ep - 1; everything else (attention, the router, shared experts, dense
// layers) stays whole on every rank. Each rank routes its own tokens; then, per layer, as
// DeepEP's dispatch and combine (Megatron's flex dispatcher, NeMo AutoModel) exchange them:
//
//   1. counts: every rank tells every other how many rows it will send it: one a token that
//      has any of its experts there, however many (an all_to_all of one number a rank);
//   2. dispatch: the rows go to those ranks (all_to_all with those splits), each carrying the
//      token's k weights for the destination's experts (0 where none), and which of the
//      destination's experts each is for (a second all_to_all, of k integers a row); the
//      destination runs each local expert on its rows from every source, in source order;
//   3. combine: each arrived row's weighted sum of its experts' outputs goes back the way it
//      came (all_to_all with the splits swapped), and the source adds it to its token.
//
// Across nodes (a cluster's nodes, StrategyOptions::node_size) as DeepEP's internode kernels
// do, in two levels: steps 1 to 3 among the members at this rank's place on every node (its
// "rail"), a token going once to each node holding any of its experts; what arrives at a node
// goes on, by the same steps, once to each member there holding any of them, and its combined
// rows come back the same way, summed at each level.
//
// Backward runs the two exchanges in reverse (the gradients of the combined rows to the
// experts, then of the dispatched rows back to their tokens). The experts' gradients are then
// those of every token of the ep group that reached them; the ranks that hold the same
// experts (the "edp" group, mesh/parallel_dims.h) reduce them, scaled by 1/ep, so that they
// are averaged over dp × cp as the dense gradients are. See docs/moe.md.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

/// Splits the routed experts of every MoE layer of `model` over `ep`: each member keeps its
/// slice and exchanges tokens with the group by `exchange` (--moe-dispatch): "deepep" (above),
/// in two levels where the group spans nodes of `node_size` GPUs (global rank r on node
/// r / node_size; 0: one node) holding the same number of its members each; or "alltoall"
/// (Megatron's alltoall token dispatcher, its default: a row for each assignment, a token
/// copied to the member of each of its experts, in one level; the source weights and sums
/// what comes back).
/// std::invalid_argument when a layer's experts do not divide by the group's size, or for
/// another exchange.
void parallelize_experts(torch::nn::Sequential& model, Communicator& comm, const Group& ep,
                         int node_size = 0, const std::string& exchange = "deepep");

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
