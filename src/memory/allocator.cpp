// Accounting allocator behind LibTorch's CPU tensors.
//
// Each block carries a 64-byte header in front of the pointer handed to LibTorch: the size,
// the owning GPU and the category, so the free is charged back exactly where the allocation
// went even if another thread drops the last reference. The DataPtr's context equals its
// data pointer because LibTorch's raw_allocate requires it.
#include "memory/allocator.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "memory/allocation_history.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace meshsim {
namespace {

constexpr size_t kAlignment = 64;

struct alignas(kAlignment) BlockHeader {
  int64_t size;
  VirtualGpu* gpu;
  MemoryCategory category;
};
static_assert(sizeof(BlockHeader) == kAlignment, "header must keep data aligned");

thread_local VirtualGpu* t_gpu = nullptr;
thread_local MemoryCategory t_category = MemoryCategory::Other;
std::atomic<int64_t> g_host_bytes{0};

void free_block(void* data) {
  if (data == nullptr) return;
  auto* header = reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - kAlignment);
  if (header->gpu != nullptr) {
    if (AllocationHistory* history = header->gpu->history())
      history->record(false, reinterpret_cast<uintptr_t>(data), header->size, header->category);
    header->gpu->release(header->size, header->category);
  }
  else
    g_host_bytes.fetch_sub(header->size, std::memory_order_relaxed);
  std::free(header);
}

class AccountingAllocator final : public c10::Allocator {
public:
  // LibTorch 1.13 declares allocate() const; 2.3+ declares it non-const and adds copy_data.
  // Declaring both without `override` compiles against either.
  c10::DataPtr allocate(size_t n) const { return allocate_block(n); }
  c10::DataPtr allocate(size_t n) { return allocate_block(n); }
  void copy_data(void* dst, const void* src, std::size_t n) const { std::memcpy(dst, src, n); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

private:
  static c10::DataPtr allocate_block(size_t n) {
    // A virtual GPU on a CUDA card is charged by the card's allocator (memory/cuda_allocator.h);
    // its rank's CPU tensors are host memory.
    VirtualGpu* gpu = t_gpu != nullptr && !t_gpu->on_card() ? t_gpu : nullptr;
    const auto bytes = static_cast<int64_t>(n);
    if (gpu != nullptr)
      gpu->charge(bytes, t_category); // throws OutOfMemory before anything is allocated
    else
      g_host_bytes.fetch_add(bytes, std::memory_order_relaxed);
    void* raw = nullptr;
    if (posix_memalign(&raw, kAlignment, n + kAlignment) != 0) {
      if (gpu != nullptr)
        gpu->release(bytes, t_category);
      else
        g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
      throw std::bad_alloc();
    }
    auto* header = static_cast<BlockHeader*>(raw);
    header->size = bytes;
    header->gpu = gpu;
    header->category = t_category;
    void* data = static_cast<char*>(raw) + kAlignment;
    if (gpu != nullptr)
      if (AllocationHistory* history = gpu->history())
        history->record(true, reinterpret_cast<uintptr_t>(data), bytes, t_category);
    return {data, data, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
};

// The meta device's allocator: meta tensors have shapes and no storage, so nothing is
// allocated, but the bytes a real device would hold are charged exactly as on CPU. The
// context (never the data pointer, which stays null as LibTorch expects on meta) carries the
// owner, so the release goes back to the right GPU and category.
struct MetaBlock {
  int64_t size;
  VirtualGpu* gpu;
  MemoryCategory category;
};

void free_meta_block(void* context) {
  auto* block = static_cast<MetaBlock*>(context);
  block->gpu->release(block->size, block->category);
  delete block;
}

class MetaAccountingAllocator final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t n) const { return allocate_block(n); }
  c10::DataPtr allocate(size_t n) { return allocate_block(n); }
  void copy_data(void*, const void*, std::size_t) const {}
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

private:
  static c10::DataPtr allocate_block(size_t n) {
    const c10::Device meta(c10::DeviceType::Meta);
    VirtualGpu* gpu = t_gpu;
    if (gpu == nullptr || n == 0)
      return {nullptr, meta}; // a host-side meta tensor takes no memory anywhere
    const auto bytes = static_cast<int64_t>(n);
    gpu->charge(bytes, t_category); // throws OutOfMemory before anything is recorded
    auto* block = new MetaBlock{bytes, gpu, t_category};
    return {nullptr, block, &free_meta_block, meta};
  }
};

AccountingAllocator& allocator() {
  // Never destroyed: tensors may outlive main's locals and still need their deleter's state.
  static auto* instance = new AccountingAllocator();
  return *instance;
}

} // namespace

void install_accounting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Activations of every step are freed and allocated again. With glibc's defaults each
    // large block is a fresh mmap and its pages fault in again every step (over a million
    // faults in 100 steps of the CNN on 8 ranks). Keeping freed blocks in the heap, as
    // GPU caching allocators do, removes that cost; accounting is unaffected (it counts
    // requested bytes, not what malloc keeps).
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_TOP_PAD, 64 << 20);
    c10::SetCPUAllocator(&allocator(), /*priority=*/100);
    // Never destroyed, for the same reason as the CPU allocator.
    static auto* meta = new MetaAccountingAllocator();
    c10::SetAllocator(c10::DeviceType::Meta, meta, /*priority=*/100);
  });
}

VirtualGpu* current_gpu() { return t_gpu; }
MemoryCategory current_category() { return t_category; }
int64_t host_bytes() { return g_host_bytes.load(std::memory_order_relaxed); }

GpuGuard::GpuGuard(VirtualGpu* gpu) : previous_(t_gpu) { t_gpu = gpu; }
GpuGuard::~GpuGuard() { t_gpu = previous_; }

CategoryScope::CategoryScope(MemoryCategory category) : previous_(t_category) {
  t_category = category;
}
CategoryScope::~CategoryScope() { t_category = previous_; }

} // namespace meshsim
