// The accounting CPU allocator: every tensor allocated on a rank's thread is charged to that
// rank's virtual GPU, under the category of the innermost CategoryScope.
//
// CPU and meta: on both, forward and backward run on the rank's own thread, so a thread-local
// "current GPU" sees every allocation (see docs/memory.md for what is and is not counted).
// Meta tensors (plans) allocate nothing; they are charged the bytes they stand for.
#pragma once

#include <cstdint>

#include "memory/category.h"
#include "memory/virtual_gpu.h"

namespace meshsim {

/// Installs the accounting allocators as LibTorch's CPU and meta allocators. Idempotent; call
/// before creating the tensors you want counted.
void install_accounting_allocator();

/// The virtual GPU of the calling thread, or nullptr (host memory, not charged).
VirtualGpu* current_gpu();
MemoryCategory current_category();

/// Bytes allocated by threads with no current GPU (data sets, host-side buffers), live now.
int64_t host_bytes();

/// Makes `gpu` the calling thread's current GPU for the guard's lifetime.
class GpuGuard {
public:
  explicit GpuGuard(VirtualGpu* gpu);
  ~GpuGuard();
  GpuGuard(const GpuGuard&) = delete;
  GpuGuard& operator=(const GpuGuard&) = delete;

private:
  VirtualGpu* previous_;
};

/// Sets the category of new allocations on this thread for the scope's lifetime.
class CategoryScope {
public:
  explicit CategoryScope(MemoryCategory category);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

private:
  MemoryCategory previous_;
};

} // namespace meshsim
