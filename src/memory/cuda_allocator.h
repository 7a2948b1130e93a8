// Virtual GPUs on one CUDA card: each gets a memory pool of its own inside LibTorch's caching
// allocator, so every CUDA byte is charged to the virtual GPU that allocated it.
//
// - Routing: every allocation made on the virtual GPU's stream goes to its pool (the caching
//   allocator's MemPool routing, keyed by stream). Backward runs on the rank's own thread
//   and stream (device/physical_device.h), so it is routed the same way.
// - Reserved bytes and capacity: the pool takes segments from the card through the virtual
//   GPU (VirtualGpu::try_reserve), so the capacity applies to what the virtual GPU really takes
//   from the card, with the caching allocator's rounding and segments. A refused segment makes
//   the caching allocator free that pool's cache and retry, then raise its out-of-memory error.
// - Categories: the allocator's trace hook charges each allocation's requested bytes to the
//   category of the allocating thread's CategoryScope, exactly as the CPU allocator does.
//
// Without CUDA (MESHSIM_CUDA 0) attach_cuda_pool throws and the queries return zeros.
#pragma once

#include <cstdint>
#include <memory>

#include "memory/virtual_gpu.h"

namespace meshsim {

/// A virtual GPU's pool on the card; detaches (stops routing, returns the pool's cached
/// segments to the card, forgets the GPU) when destroyed.
class CudaPool {
public:
  /// Routes allocations made on `stream` (a cudaStream_t) to a new pool charged to `gpu`.
  CudaPool(VirtualGpu& gpu, void* stream);
  ~CudaPool();
  CudaPool(const CudaPool&) = delete;
  CudaPool& operator=(const CudaPool&) = delete;

  /// The pool's bytes as the caching allocator reports them (its snapshot): `allocated` in
  /// whole blocks (requests rounded up to 512 B, and unsplit remainders), `reserved` in
  /// segments.
  struct Use {
    int64_t allocated = 0;
    int64_t reserved = 0;
    int64_t requested = 0;
  };
  Use use() const;

  struct State;

private:
  std::shared_ptr<State> state_;
};

/// The whole card as LibTorch's caching allocator reports it (device 0, every pool), like
/// torch.cuda.memory_allocated / memory_reserved and the requested-bytes statistic.
CudaPool::Use cuda_card_use();

/// Waits until every stream on the card is idle.
void cuda_synchronize();

} // namespace meshsim
