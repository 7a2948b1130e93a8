// See cuda_allocator.h. All of it is CUDA-only; without CUDA the pool cannot be made.
#include "memory/cuda_allocator.h"

#include <stdexcept>

#include "memory/allocator.h"

#if MESHSIM_CUDA
#include <ATen/ATen.h>
#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <map>
#include <mutex>
#include <unordered_map>
#endif

namespace meshsim {

#if MESHSIM_CUDA

namespace alloc = c10::cuda::CUDACachingAllocator;

struct CudaPool::State {
  std::mutex mutex;          // guards gpu against the detach
  VirtualGpu* gpu = nullptr; // null once detached
  void* stream = nullptr;
  std::shared_ptr<at::cuda::MemPool> pool;
  c10::MempoolId_t id{0, 0};
};

namespace {

// One live allocation, charged where and as what it was allocated.
struct Charge {
  std::shared_ptr<CudaPool::State> owner;
  int64_t bytes;
  MemoryCategory category;
};

// The pools, and the live allocations of each, keyed by address. Guarded by registry_mutex.
// The trace hook runs under the caching allocator's lock and takes this one; nothing here
// calls the allocator while holding it, so the two are always taken in that order.
std::mutex registry_mutex;
std::map<c10::MempoolId_t, std::shared_ptr<CudaPool::State>>& pools() {
  static auto* p = new std::map<c10::MempoolId_t, std::shared_ptr<CudaPool::State>>();
  return *p;
}
std::unordered_map<size_t, Charge>& live() {
  static auto* m = new std::unordered_map<size_t, Charge>();
  return *m;
}

std::shared_ptr<CudaPool::State> owner_of(const c10::MempoolId_t& id) {
  const auto it = pools().find(id);
  return it == pools().end() ? nullptr : it->second;
}

void release(const Charge& c) {
  std::lock_guard<std::mutex> lock(c.owner->mutex);
  if (c.owner->gpu)
    c.owner->gpu->release(c.bytes, c.category);
}

void on_trace(const alloc::TraceEntry& e) {
  using Action = alloc::TraceEntry::Action;
  if (e.action_ != Action::ALLOC && e.action_ != Action::FREE_COMPLETED)
    return;
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& m = live();
  // An address handed out again was freed before, whatever the hook saw of it.
  if (auto it = m.find(e.addr_); it != m.end()) {
    release(it->second);
    m.erase(it);
  }
  if (e.action_ != Action::ALLOC)
    return;
  auto owner = owner_of(e.mempool_);
  if (!owner)
    return; // not a virtual GPU's pool: LibTorch's own, or the host's work on the card
  Charge c{owner, static_cast<int64_t>(e.size_), current_category()};
  {
    std::lock_guard<std::mutex> owner_lock(owner->mutex);
    if (!owner->gpu)
      return;
    owner->gpu->add(c.bytes, c.category);
  }
  m.emplace(e.addr_, std::move(c));
}

// The caching allocator exists once CUDA is initialized, which LibTorch does lazily at the
// first CUDA tensor; before that its per-device state (pools, trace hooks) cannot be reached.
void ensure_allocator() {
  static std::once_flag once;
  std::call_once(once, [] { (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, 0)); });
}

void install_trace_hook() {
  ensure_allocator();
  static std::once_flag once;
  std::call_once(once, [] { alloc::attachAllocatorTraceTracker(&on_trace); });
}

} // namespace

CudaPool::CudaPool(VirtualGpu& gpu, void* stream) : state_(std::make_shared<State>()) {
  install_trace_hook();
  state_->gpu = &gpu;
  state_->stream = stream;
  std::weak_ptr<State> weak = state_;
  // Segments come from the card only through the virtual GPU's capacity.
  auto segments = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
      [weak](size_t size, int, cudaStream_t) -> void* {
        auto s = weak.lock(); // never expired: the registry keeps every pool's state
        const auto bytes = static_cast<int64_t>(size);
        if (s) {
          std::lock_guard<std::mutex> lock(s->mutex);
          if (s->gpu && !s->gpu->try_reserve(bytes))
            return nullptr;
        }
        void* p = nullptr;
        if (cudaMalloc(&p, size) != cudaSuccess) {
          cudaGetLastError(); // the caching allocator reports the failure as out of memory
          if (s) {
            std::lock_guard<std::mutex> lock(s->mutex);
            if (s->gpu)
              s->gpu->unreserve(bytes);
          }
          return nullptr;
        }
        return p;
      },
      [weak](void* p, size_t size, int, cudaStream_t) {
        cudaFree(p);
        if (auto s = weak.lock()) {
          std::lock_guard<std::mutex> lock(s->mutex);
          if (s->gpu)
            s->gpu->unreserve(static_cast<int64_t>(size));
        }
      });
  state_->pool = std::make_shared<at::cuda::MemPool>(segments, /*is_user_created=*/true);
  state_->id = state_->pool->id();
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    pools().emplace(state_->id, state_);
  }
  const auto target = static_cast<cudaStream_t>(stream);
  alloc::beginAllocateToPool(0, state_->id, [target](cudaStream_t s) { return s == target; });
}

CudaPool::~CudaPool() {
  try {
    alloc::endAllocateToPool(0, state_->id);
    c10::cuda::device_synchronize();
    alloc::emptyCache(state_->id); // the pool's cached segments go back to the card
  } catch (...) {
    // A broken card at teardown must not end the process here.
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    for (auto it = live().begin(); it != live().end();)
      it = it->second.owner == state_ ? live().erase(it) : std::next(it);
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->gpu = nullptr; // tensors that outlive the mesh are freed uncharged
  // The MemPool itself stays registered (kept by the registry) so that segments still
  // holding such tensors are returned to the card through it when they are freed.
}

CudaPool::Use CudaPool::use() const {
  Use u;
  const auto snapshot = alloc::snapshot(state_->id, /*include_traces=*/false);
  for (const auto& seg : snapshot.segments) {
    if (seg.owner_private_pool_id != state_->id)
      continue;
    u.allocated += static_cast<int64_t>(seg.allocated_size);
    u.reserved += static_cast<int64_t>(seg.total_size);
    u.requested += static_cast<int64_t>(seg.requested_size);
  }
  return u;
}

CudaPool::Use cuda_card_use() {
  ensure_allocator();
  const auto stats = alloc::getDeviceStats(0);
  const auto all = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
  CudaPool::Use u;
  u.allocated = stats.allocated_bytes[all].current;
  u.reserved = stats.reserved_bytes[all].current;
  u.requested = stats.requested_bytes[all].current;
  return u;
}

void cuda_synchronize() { c10::cuda::device_synchronize(); }

#else

struct CudaPool::State {};
CudaPool::CudaPool(VirtualGpu&, void*) {
  throw std::runtime_error("this meshsim was built without CUDA");
}
CudaPool::~CudaPool() = default;
CudaPool::Use CudaPool::use() const { return {}; }
CudaPool::Use cuda_card_use() { return {}; }
void cuda_synchronize() {}

#endif

} // namespace meshsim
