// The reduction kernel behind all_reduce, reduce and reduce_scatter in the sim backend.
#pragma once

#include <cstdint>
#include <vector>

#include <c10/core/ScalarType.h>

#include "comm/communicator.h"

namespace meshsim {

/// Reduces elements [lo, hi) of every buffer in `inputs` (in order, so results are
/// deterministic) and writes the result to the same range of every buffer in `outputs`.
/// `Avg` divides the sum by `count`. Outputs may alias inputs: each block is read in full
/// before it is written.
void reduce_into(c10::ScalarType dtype, const std::vector<void*>& inputs,
                 const std::vector<void*>& outputs, int64_t lo, int64_t hi, ReduceOp op,
                 int count);

} // namespace meshsim
