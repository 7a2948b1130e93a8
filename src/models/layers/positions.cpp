// The per-thread scope of token positions.
#include "models/layers/positions.h"

#include <stdexcept>
#include <string>

namespace meshsim {
namespace {

thread_local torch::Tensor current_scope_positions;

} // namespace

PositionsScope::PositionsScope(torch::Tensor positions)
    : previous_(std::move(current_scope_positions)) {
  current_scope_positions = std::move(positions);
}

PositionsScope::~PositionsScope() { current_scope_positions = std::move(previous_); }

torch::Tensor scoped_positions() { return current_scope_positions; }

torch::Tensor resolve_positions(const torch::Tensor& given, int64_t length) {
  if (given.defined())
    return given;
  const torch::Tensor& scoped = current_scope_positions;
  if (scoped.defined() && (scoped.dim() != 1 || scoped.size(0) != length))
    throw std::invalid_argument("positions: the scope holds " + std::to_string(scoped.numel()) +
                                " positions for a sequence of " + std::to_string(length));
  return scoped;
}

} // namespace meshsim
