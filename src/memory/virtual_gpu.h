// VirtualGpu: one simulated device's memory — capacity, live bytes by category, peaks.
//
// Counters are atomics so that any thread may read every GPU's live bytes (the memory
// timeline samples all GPUs at once) while each rank's thread allocates on its own GPU.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "memory/category.h"

namespace meshsim {

/// Thrown when an allocation would exceed a virtual GPU's capacity.
class OutOfMemory : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct MemoryStats {
  int64_t capacity = 0;
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocations = 0;
  /// On CUDA: the bytes the virtual GPU's memory pool has taken from the card (the caching
  /// allocator's segments, as torch.cuda.memory_reserved counts them); 0 elsewhere.
  int64_t reserved = 0;
  int64_t peak_reserved = 0;
  CategoryBytes current_by_category{};
  CategoryBytes peak_by_category{};
};

/// "parameters 1.6 MiB, gradients 1.6 MiB, ...": live bytes by category; `skip_empty`
/// leaves out categories holding nothing.
std::string describe_use(const MemoryStats& stats, bool skip_empty);

/// The host memory that all virtual GPUs of a process take together: they live in the
/// host's RAM, so their sum must stay below what the host can give, whatever each GPU's own
/// capacity says. A charge past the limit is an OutOfMemory naming the host.
class HostBudget {
public:
  explicit HostBudget(int64_t limit_bytes) : limit_(limit_bytes) {}
  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  /// Adds `bytes` and returns true, or returns false and adds nothing if over the limit.
  bool try_charge(int64_t bytes);
  void release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

/// What the host can give the virtual GPUs: the memory available now (MemAvailable) less a
/// headroom for meshsim's own untracked memory (threads, kernels' scratch, the data set).
int64_t host_memory_for_gpus();

class AllocationHistory;

class VirtualGpu {
public:
  /// `host` (may be null, must outlive the GPU) is shared by every GPU of a mesh.
  VirtualGpu(int rank, int64_t capacity_bytes, HostBudget* host = nullptr);
  VirtualGpu(const VirtualGpu&) = delete;
  VirtualGpu& operator=(const VirtualGpu&) = delete;

  int rank() const { return rank_; }
  /// The GPU is carved out of a CUDA card: its memory is the card's, and host tensors its
  /// rank makes (batches before the copy, loss values) are host memory, not its own.
  void mark_on_card() { on_card_ = true; }
  bool on_card() const { return on_card_; }
  int64_t capacity() const { return capacity_; }
  std::string name() const { return "gpu" + std::to_string(rank_); }

  /// Charges `bytes` to `category`; throws OutOfMemory (and remembers the message) when the
  /// GPU would go over capacity. Nothing is charged when it throws. Counts one charge of the
  /// calling thread (thread_charge_count).
  void charge(int64_t bytes, MemoryCategory category);
  /// Returns bytes previously charged to `category`.
  void release(int64_t bytes, MemoryCategory category);

  /// Charges `bytes` with no capacity check: on CUDA an allocation is already inside a
  /// segment the GPU reserved, and the capacity applies to the segments (try_reserve).
  void add(int64_t bytes, MemoryCategory category);
  /// A segment of `bytes` taken from the card for this GPU's pool; false (and nothing taken)
  /// when it would pass the capacity. The refusal is remembered for the OOM message.
  bool try_reserve(int64_t bytes);
  void unreserve(int64_t bytes);
  int64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }
  /// The device's own out-of-memory error reached this GPU's rank: the run ends with this GPU
  /// out of memory, described by its last refused segment, or by `device_message` if the card
  /// itself was full first.
  void device_out_of_memory(const std::string& device_message);

  int64_t current_bytes() const { return current_.load(std::memory_order_relaxed); }
  CategoryBytes current_by_category() const {
    CategoryBytes out{};
    for (int c = 0; c < kNumCategories; ++c)
      out[static_cast<size_t>(c)] = current_by_category_[static_cast<size_t>(c)].load(std::memory_order_relaxed);
    return out;
  }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  MemoryStats stats() const;
  /// Resets peaks to the current values (e.g. after setup, to measure a step alone).
  void reset_peaks();
  /// Ends a window opened by reset_peaks(): the peaks become those of `saved` (taken before
  /// the window), or the current values where higher, so the window's own peak is left out.
  /// Used to keep evaluation out of the training peaks.
  void restore_peaks(const MemoryStats& saved);

  /// Called on the allocating thread when an allocation does not fit, before OutOfMemory is
  /// thrown (while what the GPU held is still held). Set before any rank runs.
  void set_on_out_of_memory(std::function<void()> hook) { on_out_of_memory_ = std::move(hook); }

  /// The OutOfMemory message if this GPU ever ran out, else empty.
  std::string oom_message() const;

  /// Where this GPU's allocations and frees are recorded (--memory-snapshot); null: nowhere.
  /// The history must outlive every allocation made while it is set.
  void set_history(AllocationHistory* history) { history_.store(history, std::memory_order_release); }
  AllocationHistory* history() const { return history_.load(std::memory_order_acquire); }

private:
  std::string describe_oom(int64_t request, MemoryCategory category) const;
  std::string describe_host_oom(int64_t request, MemoryCategory category) const;

  const int rank_;
  const int64_t capacity_;
  HostBudget* host_;
  bool on_card_ = false;
  std::atomic<AllocationHistory*> history_{nullptr};
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> reserved_{0};
  std::atomic<int64_t> peak_reserved_{0};
  std::array<std::atomic<int64_t>, kNumCategories> current_by_category_{};
  std::array<std::atomic<int64_t>, kNumCategories> peak_by_category_{};
  mutable std::mutex oom_mutex_;
  std::string oom_message_;
  std::string refusal_; // the last segment try_reserve refused
  std::function<void()> on_out_of_memory_;
};

/// Charges the calling thread has made to any virtual GPU so far. A rank's thread runs its
/// program in a fixed order, so the count says how far through it the rank is, the same in
/// every run of the same program (unlike the clock): the cost model splits a compute region
/// at the collectives inside it by this count.
int64_t thread_charge_count();

/// Counts `charges` more for the calling thread without making them: a plan that skips work
/// whose charges it knows (the ring's repeated blocks on meta, parallel/context) keeps the
/// count where the work would have left it.
void skip_charges(int64_t charges);

/// Parameters + gradients + optimizer state a GPU holds now: its model state.
int64_t model_state_bytes(const VirtualGpu& gpu);

} // namespace meshsim
