// FlatUnit: the flat buffer behind a group of parameters under ZeRO (one Sequential block for
// stage 3, consecutive blocks up to the bucket size for stages 0-2), as FSDP's FlatParameter.
//
// The unit's parameters become views into one flat tensor `full`, padded with zeros to a
// multiple of the number of shards so that member i owns the contiguous elements
// [i*S, (i+1)*S) with S = padded / shards. For stage 3 the storage of `full` is released
// between uses while the tensors stay alive (see release_full), so autograd's saved
// references to the parameters see the data again once it is gathered back.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

struct FlatUnit {
  std::vector<torch::Tensor> params; // module parameters, views into `full`
  std::vector<int64_t> offsets;      // where each parameter starts in `full`
  int64_t numel = 0;                 // real elements (sum of the parameters)
  int64_t padded = 0;                // numel rounded up to a multiple of the shard count
  int64_t shard_numel = 0;           // padded / shards
  Group group;                       // the ranks it is reduced and sharded over
  Group replicate;                   // HSDP: the replicas its shard's gradient is averaged over
  double gradient_scale = 1;         // its group's (ParamGroup::gradient_scale)
  int member = 0;                    // this rank's index in `group`: which shard it owns

  torch::Tensor full;       // [padded], charged to parameters
  torch::Tensor grad;       // stages 0-1: [padded] under gradients; params' .grad are views
  torch::Tensor shard;      // what the optimizer updates (a view of `full`, or own for stage 3)
  torch::Tensor shard_grad; // the gradient of `shard`
  torch::Tensor bucket;     // stages 2-3: [padded] under communication, only during backward
  int pending = 0;          // gradients still to arrive in this backward pass
  bool materialized = true; // whether `full` has storage now (stage 3)

  int64_t bytes() const { return padded * static_cast<int64_t>(full.element_size()); }
};

/// Builds a unit over `params` (all the same dtype): allocates `full` under `parameters`,
/// copies the values in and makes every parameter a view of it (the old storage is freed).
FlatUnit make_flat_unit(std::vector<torch::Tensor> params, int shards);

/// Member `index`'s contiguous 1/shards of `t` (a [padded] tensor): a view.
torch::Tensor shard_of(const FlatUnit& unit, const torch::Tensor& t, int index);

/// Frees the storage of `full` (so of every parameter view) but keeps the tensors: the
/// StorageImpl's DataPtr is swapped for an empty one and its size set to 0, as FSDP does
/// with storage().resize_(0). The bytes are returned to the virtual GPU at once.
void release_full(FlatUnit& unit);

/// Gives `full` storage again, charged to `parameters`, unfilled (an all-gather fills it).
/// A no-op when it is already materialized.
void allocate_full(FlatUnit& unit);

/// Gives `full` storage again (charged to `parameters`) and fills it by all-gathering every
/// member's `shard` over `group`. A no-op when it is already materialized.
void gather_full(FlatUnit& unit, Communicator& comm, const Group& group);

/// All-gathers the shards into the (always materialized) `full` of stages 1 and 2.
void all_gather_into_full(FlatUnit& unit, Communicator& comm, const Group& group);

} // namespace meshsim
