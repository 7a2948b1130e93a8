// Per-virtual-GPU accounting. Lock-free on the allocation path; see virtual_gpu.h.
#include "memory/virtual_gpu.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

namespace meshsim {
namespace {

void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

} // namespace

bool HostBudget::try_charge(int64_t bytes) {
  const int64_t now = used_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (now <= limit_)
    return true;
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  return false;
}

int64_t host_memory_for_gpus() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0, available = -1;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:")
      available = kib * 1024;
  if (available < 0)
    available = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  // Headroom: 1 GiB, or a tenth of what is available when that is more.
  const int64_t headroom = std::max<int64_t>(int64_t{1} << 30, available / 10);
  return std::max<int64_t>(available - headroom, 0);
}

VirtualGpu::VirtualGpu(int rank, int64_t capacity_bytes, HostBudget* host)
    : rank_(rank), capacity_(capacity_bytes), host_(host) {}

namespace {
thread_local int64_t t_charges = 0;
} // namespace

int64_t thread_charge_count() { return t_charges; }

void skip_charges(int64_t charges) { t_charges += charges; }

void VirtualGpu::charge(int64_t bytes, MemoryCategory category) {
  ++t_charges;
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const bool fits = now <= capacity_;
  if (!fits || (host_ && !host_->try_charge(bytes))) {
    current_.fetch_sub(bytes, std::memory_order_relaxed);
    std::string message = fits ? describe_host_oom(bytes, category) : describe_oom(bytes, category);
    {
      std::lock_guard<std::mutex> lock(oom_mutex_);
      if (oom_message_.empty())
        oom_message_ = message;
    }
    if (on_out_of_memory_) on_out_of_memory_();
    throw OutOfMemory(message);
  }
  raise_to(peak_, now);
  const auto c = static_cast<size_t>(category);
  const int64_t in_category =
      current_by_category_[c].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raise_to(peak_by_category_[c], in_category);
  allocations_.fetch_add(1, std::memory_order_relaxed);
}

void VirtualGpu::release(int64_t bytes, MemoryCategory category) {
  if (host_)
    host_->release(bytes);
  current_.fetch_sub(bytes, std::memory_order_relaxed);
  current_by_category_[static_cast<size_t>(category)].fetch_sub(bytes, std::memory_order_relaxed);
}

void VirtualGpu::add(int64_t bytes, MemoryCategory category) {
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raise_to(peak_, now);
  const auto c = static_cast<size_t>(category);
  raise_to(peak_by_category_[c],
           current_by_category_[c].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  allocations_.fetch_add(1, std::memory_order_relaxed);
}

bool VirtualGpu::try_reserve(int64_t bytes) {
  const int64_t now = reserved_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (now <= capacity_) {
    raise_to(peak_reserved_, now);
    return true;
  }
  reserved_.fetch_sub(bytes, std::memory_order_relaxed);
  const MemoryStats s = stats();
  std::string message = fmt::format(
      "out of memory on {}: its pool needed another {} segment; reserved {}, allocated {} ({}); "
      "capacity {}",
      name(), format_bytes(bytes), format_bytes(s.reserved), format_bytes(s.current),
      describe_use(s, /*skip_empty=*/true), format_bytes(capacity_));
  std::lock_guard<std::mutex> lock(oom_mutex_);
  refusal_ = std::move(message);
  return false;
}

void VirtualGpu::unreserve(int64_t bytes) { reserved_.fetch_sub(bytes, std::memory_order_relaxed); }

void VirtualGpu::device_out_of_memory(const std::string& device_message) {
  std::lock_guard<std::mutex> lock(oom_mutex_);
  if (!oom_message_.empty())
    return;
  if (!refusal_.empty())
    oom_message_ = refusal_;
  else
    oom_message_ = fmt::format("out of memory on {}: the card itself is full: {}", name(),
                               device_message.substr(0, device_message.find('\n')));
}

MemoryStats VirtualGpu::stats() const {
  MemoryStats s;
  s.capacity = capacity_;
  s.current = current_.load(std::memory_order_relaxed);
  s.peak = peak_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  s.reserved = reserved_.load(std::memory_order_relaxed);
  s.peak_reserved = peak_reserved_.load(std::memory_order_relaxed);
  for (int c = 0; c < kNumCategories; ++c) {
    s.current_by_category[c] = current_by_category_[c].load(std::memory_order_relaxed);
    s.peak_by_category[c] = peak_by_category_[c].load(std::memory_order_relaxed);
  }
  return s;
}

void VirtualGpu::reset_peaks() {
  peak_.store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  peak_reserved_.store(reserved_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  for (int c = 0; c < kNumCategories; ++c)
    peak_by_category_[c].store(current_by_category_[c].load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
}

void VirtualGpu::restore_peaks(const MemoryStats& saved) {
  peak_.store(std::max(saved.peak, current_.load(std::memory_order_relaxed)),
              std::memory_order_relaxed);
  for (int c = 0; c < kNumCategories; ++c)
    peak_by_category_[c].store(std::max(saved.peak_by_category[c],
                                        current_by_category_[c].load(std::memory_order_relaxed)),
                               std::memory_order_relaxed);
}

std::string VirtualGpu::oom_message() const {
  std::lock_guard<std::mutex> lock(oom_mutex_);
  return oom_message_;
}

std::string describe_use(const MemoryStats& stats, bool skip_empty) {
  std::string use;
  for (auto c : kAllCategories) {
    const int64_t b = stats.current_by_category[static_cast<size_t>(c)];
    if (skip_empty && b == 0)
      continue;
    if (!use.empty())
      use += ", ";
    use += fmt::format("{} {}", category_name(c), format_bytes(b));
  }
  return use;
}

std::string VirtualGpu::describe_oom(int64_t request, MemoryCategory category) const {
  const MemoryStats s = stats();
  return fmt::format(
      "out of memory on {}: tried to allocate {} for {}; in use {} ({}); capacity {}", name(),
      format_bytes(request), category_name(category), format_bytes(s.current),
      describe_use(s, /*skip_empty=*/false), format_bytes(capacity_));
}

std::string VirtualGpu::describe_host_oom(int64_t request, MemoryCategory category) const {
  return fmt::format("out of host memory: {} tried to allocate {} for {}, but the virtual GPUs "
                     "already hold {} together and this machine can give them {}; use fewer "
                     "--gpus, smaller batches, or a smaller model",
                     name(), format_bytes(request), category_name(category),
                     format_bytes(host_->used()), format_bytes(host_->limit()));
}

int64_t model_state_bytes(const VirtualGpu& gpu) {
  const auto s = gpu.stats();
  auto at = [&](MemoryCategory c) { return s.current_by_category[static_cast<size_t>(c)]; };
  return at(MemoryCategory::Parameters) + at(MemoryCategory::Gradients) +
         at(MemoryCategory::Optimizer);
}

} // namespace meshsim
