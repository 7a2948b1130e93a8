// The positions of the tokens a rank's model runs on, when they are not 0..T-1: context
// parallelism gives each rank two non-contiguous chunks of the sequence, and the blocks of a
// Sequential are called with x alone. The strategy opens a PositionsScope around a step
// (ranks are threads, so the scope is per thread); the GPT's position embedding and every
// attention module read it when no positions are passed explicitly.
#pragma once

#include <torch/torch.h>

namespace meshsim {

/// While alive, scoped_positions() on this thread is `positions` (int64 [T]); nested scopes
/// restore the outer one when they end.
class PositionsScope {
public:
  explicit PositionsScope(torch::Tensor positions);
  ~PositionsScope();
  PositionsScope(const PositionsScope&) = delete;
  PositionsScope& operator=(const PositionsScope&) = delete;

private:
  torch::Tensor previous_;
};

/// The innermost scope's positions on this thread; undefined outside any scope.
torch::Tensor scoped_positions();

/// `given` when defined, else the scope's positions (which must then hold `length` tokens:
/// std::invalid_argument otherwise), else undefined (the caller's 0..length-1).
torch::Tensor resolve_positions(const torch::Tensor& given, int64_t length);

} // namespace meshsim
