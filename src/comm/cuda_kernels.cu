// See cuda_kernels.h. A grid-stride loop: each element of the slice is read from every input
// and written to every output once, so the reduction moves the fewest bytes it can.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "comm/cuda_kernels.h"

namespace meshsim {
namespace {

struct Buffers {
  const void* in[kMaxCudaReduceBuffers];
  void* out[kMaxCudaReduceBuffers];
  int n_in;
  int n_out;
};

// Arithmetic in the element type, as the CPU kernel does: 16-bit floats round after each
// addition (c10's BFloat16 and Half do the same through float).
template <typename T> struct Arith {
  __device__ static T add(T a, T b) { return a + b; }
  __device__ static T max(T a, T b) { return a > b ? a : b; }
  __device__ static T div(T a, int n) { return a / static_cast<T>(n); }
};
template <> struct Arith<__nv_bfloat16> {
  using T = __nv_bfloat16;
  __device__ static T add(T a, T b) { return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b)); }
  __device__ static T max(T a, T b) { return __bfloat162float(a) > __bfloat162float(b) ? a : b; }
  __device__ static T div(T a, int n) { return __float2bfloat16_rn(__bfloat162float(a) / __bfloat162float(__float2bfloat16_rn(static_cast<float>(n)))); }
};
template <> struct Arith<__half> {
  using T = __half;
  __device__ static T add(T a, T b) { return __float2half_rn(__half2float(a) + __half2float(b)); }
  __device__ static T max(T a, T b) { return __half2float(a) > __half2float(b) ? a : b; }
  __device__ static T div(T a, int n) { return __float2half_rn(__half2float(a) / __half2float(__float2half_rn(static_cast<float>(n)))); }
};

template <typename T>
__global__ void reduce_kernel(Buffers b, int64_t lo, int64_t hi, int op, int count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = lo + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < hi;
       i += stride) {
    T acc = static_cast<const T*>(b.in[0])[i];
    for (int j = 1; j < b.n_in; ++j) {
      const T x = static_cast<const T*>(b.in[j])[i];
      acc = op == 2 ? Arith<T>::max(acc, x) : Arith<T>::add(acc, x);
    }
    if (op == 1)
      acc = Arith<T>::div(acc, count);
    for (int j = 0; j < b.n_out; ++j)
      static_cast<T*>(b.out[j])[i] = acc;
  }
}

template <typename T>
void launch(const Buffers& b, int64_t lo, int64_t hi, int op, int count, cudaStream_t stream) {
  constexpr int threads = 256;
  const int64_t blocks_needed = (hi - lo + threads - 1) / threads;
  const int blocks = static_cast<int>(blocks_needed < 132 * 16 ? blocks_needed : 132 * 16);
  reduce_kernel<T><<<blocks, threads, 0, stream>>>(b, lo, hi, op, count);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw std::runtime_error(std::string("reduction kernel launch failed: ") + cudaGetErrorString(e));
}

} // namespace

void reduce_into_cuda(CudaDtype dtype, const void* const* inputs, int n_inputs,
                      void* const* outputs, int n_outputs, int64_t lo, int64_t hi, CudaReduce op,
                      int count, void* stream) {
  if (lo >= hi)
    return;
  Buffers b{};
  b.n_in = n_inputs;
  b.n_out = n_outputs;
  for (int j = 0; j < n_inputs; ++j) b.in[j] = inputs[j];
  for (int j = 0; j < n_outputs; ++j) b.out[j] = outputs[j];
  const int code = op == CudaReduce::Avg ? 1 : op == CudaReduce::Max ? 2 : 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
  case CudaDtype::Float: return launch<float>(b, lo, hi, code, count, s);
  case CudaDtype::Double: return launch<double>(b, lo, hi, code, count, s);
  case CudaDtype::Long: return launch<long long>(b, lo, hi, code, count, s);
  case CudaDtype::Int: return launch<int>(b, lo, hi, code, count, s);
  case CudaDtype::BFloat16: return launch<__nv_bfloat16>(b, lo, hi, code, count, s);
  case CudaDtype::Half: return launch<__half>(b, lo, hi, code, count, s);
  case CudaDtype::Byte: return launch<unsigned char>(b, lo, hi, code, count, s); // copies
  }
}

} // namespace meshsim
