// What a communicating autograd function keeps for its backward: its communicator and group.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "comm/communicator.h"

namespace meshsim {

/// Autograd's saved_data holds IValues: the communicator travels as its address (it outlives
/// every step), the group as its ranks (the caller's Group may be a temporary).
inline void save_group(torch::autograd::AutogradContext* ctx, Communicator* comm,
                       const Group& group) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
  ctx->saved_data["ranks"] = std::vector<int64_t>(group.ranks.begin(), group.ranks.end());
}

inline Communicator& saved_comm(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

inline Group saved_group(torch::autograd::AutogradContext* ctx) {
  Group group;
  for (int64_t r : ctx->saved_data["ranks"].toIntVector())
    group.ranks.push_back(static_cast<int>(r));
  return group;
}

} // namespace meshsim
