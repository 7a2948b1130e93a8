// The in-process collectives' reduction on a CUDA card: one kernel reads a slice of every
// rank's buffer once and writes the result into every output once, on the calling rank's
// stream. Same arithmetic as comm/kernels.h (inputs added in rank order in the element type,
// Avg divides the sum by the count). Plain C++ only, so nvcc never sees LibTorch's headers;
// built only when LibTorch has CUDA.
#pragma once

#include <cstdint>

namespace meshsim {

/// Most buffers one launch combines (inputs and outputs each).
constexpr int kMaxCudaReduceBuffers = 64;

enum class CudaDtype { Float, Double, Long, Int, BFloat16, Half, Byte };
enum class CudaReduce { Sum, Avg, Max };

/// Elements [lo, hi) of every input reduced into the same range of every output, queued on
/// `stream` (a cudaStream_t). Throws std::runtime_error if the launch fails.
void reduce_into_cuda(CudaDtype dtype, const void* const* inputs, int n_inputs,
                      void* const* outputs, int n_outputs, int64_t lo, int64_t hi, CudaReduce op,
                      int count, void* stream);

} // namespace meshsim
