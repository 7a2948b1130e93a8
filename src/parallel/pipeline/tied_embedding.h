// A tied head across pipeline stages, as Megatron-LM shares the word embedding: the first
// stage holds the embedding, the last stage a copy of its word embedding for the head
// (initialised to the same values), and after backward the embedding group (the first and
// last stage's ranks with the same dp and tp index, ParallelDims::embedding_group) sums the
// two copies' gradients (Megatron's _allreduce_word_embedding_grads), so both copies take the
// same step and stay equal. Under tensor parallelism the copy is a head of its own, so it is
// split over the vocabulary as an untied head is (VocabParallelHead, when the vocabulary
// divides); meshsim's embedding is not vocabulary-parallel, so the first stage's rank t sums
// its rows of the shard t with the last stage's rank t and all-gathers the sums over tp.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

/// One rank's part of the tied embedding: its copy (the first stage's embedding weight, or
/// the last stage's head weight or shard of it; undefined on other ranks and without a tied
/// head) and its embedding group.
struct TiedEmbedding {
  torch::Tensor weight;
  Group group;
  /// The first stage when the last stage's copy is split over the vocabulary: its tp group,
  /// its index there, and the rows of the copy each tp rank holds. Empty: whole copies.
  Group tp;
  int tp_index = 0;
  int64_t rows = 0;
  int copy_index = -1;  // the last stage: the copy's place in its stage's parameters()
};

/// The word embedding the child `head` of the whole model reads when it is a tied head;
/// undefined when the head has its own weight (or there is no such child).
torch::Tensor tied_word_embedding(const torch::nn::Sequential& model, const std::string& head);

/// `model` with its child `head` replaced by a bias-free Linear [vocab, hidden] whose weight
/// is a copy of `word`, made with `word`'s options (the meta device in a plan) under the
/// caller's GPU and category; the other children are shared. Throws std::invalid_argument
/// when the model has no such child.
torch::nn::Sequential with_head_copy(const torch::nn::Sequential& model, const std::string& head,
                                     const torch::Tensor& word);

/// Collective over tied.group (and, on a first stage paired with vocabulary shards, tied.tp):
/// sums the copies' gradients in place, after the data-parallel reduction, on whole
/// gradients. Nothing without a weight or with a group of one. A sum of two is the same bits
/// on both members, and a gather copies them, so the copies stay bitwise equal.
void all_reduce_word_embedding_grads(Communicator& comm, const TiedEmbedding& tied);

} // namespace meshsim
