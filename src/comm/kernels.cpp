// Blocked reduction: a block of every input is combined in a small cache-resident buffer,
// then copied to every output. Each input byte is read once and each output byte written
// once, which is the least memory traffic an all-reduce can do.
#include "comm/kernels.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace meshsim {
namespace {

constexpr int64_t kBlockBytes = 32 * 1024;  // fits in L1/L2 with room for the inputs' lines

template <typename T>
void reduce_typed(const std::vector<void*>& inputs, const std::vector<void*>& outputs, int64_t lo,
                  int64_t hi, ReduceOp op, int count) {
  constexpr int64_t block = kBlockBytes / static_cast<int64_t>(sizeof(T));
  alignas(64) T acc[block];
  const size_t n_in = inputs.size();
  for (int64_t start = lo; start < hi; start += block) {
    const int64_t len = std::min(block, hi - start);
    const T* first = static_cast<const T*>(inputs[0]) + start;
    std::memcpy(acc, first, len * sizeof(T));
    for (size_t j = 1; j < n_in; ++j) {
      const T* src = static_cast<const T*>(inputs[j]) + start;
      if (op == ReduceOp::Max) {
        for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], src[i]);
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] += src[i];
      }
    }
    if (op == ReduceOp::Avg) {
      const T divisor = static_cast<T>(count);
      for (int64_t i = 0; i < len; ++i) acc[i] /= divisor;
    }
    for (void* out : outputs) std::memcpy(static_cast<T*>(out) + start, acc, len * sizeof(T));
  }
}

} // namespace

void reduce_into(c10::ScalarType dtype, const std::vector<void*>& inputs,
                 const std::vector<void*>& outputs, int64_t lo, int64_t hi, ReduceOp op,
                 int count) {
  if (lo >= hi) return;
  switch (dtype) {
  case c10::ScalarType::Float: return reduce_typed<float>(inputs, outputs, lo, hi, op, count);
  case c10::ScalarType::Double: return reduce_typed<double>(inputs, outputs, lo, hi, op, count);
  case c10::ScalarType::Long: return reduce_typed<int64_t>(inputs, outputs, lo, hi, op, count);
  case c10::ScalarType::Int: return reduce_typed<int32_t>(inputs, outputs, lo, hi, op, count);
  // Mixed precision's gradients: each addition rounds to the element type, as NCCL's
  // reductions of 16-bit types do between ring steps.
  case c10::ScalarType::BFloat16:
    return reduce_typed<c10::BFloat16>(inputs, outputs, lo, hi, op, count);
  case c10::ScalarType::Half: return reduce_typed<c10::Half>(inputs, outputs, lo, hi, op, count);
  default:
    throw std::invalid_argument(std::string("reductions support float, double, bfloat16, half, int and long, not ") +
                                c10::toString(dtype));
  }
}

} // namespace meshsim
