// DeviceMesh construction and the physical-device memory query behind `--gpu-mem auto`.
#include "mesh/device_mesh.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "comm/record_only.h"
#include "device/nvml.h"
#include "mesh/meta_device.h"

namespace meshsim {
namespace {

/// NVML's index of the card a CUDA run is on, or -1 with a one-line note saying why memory.csv
/// will have no card columns.
int nvml_card(Nvml& nvml, const std::string& device) {
  std::string why = nvml.reason();
  if (nvml.available()) {
    const auto index = nvml_index_of_cuda_device(device, std::getenv("CUDA_VISIBLE_DEVICES"), &why);
    if (index && nvml.sample(*index, &why))
      return *index;
  }
  fmt::print(stderr, "meshsim: memory.csv has no card columns: {}\n", why);
  return -1;
}

} // namespace

int64_t auto_capacity(const std::string& device, int world_size) {
  if (device == "meta")
    throw std::invalid_argument("a plan's GPUs need an explicit capacity (the target GPU's memory)");
  if (device == "cuda") {
    const CudaStatus card = cuda_status();
    if (!card.usable)
      throw std::invalid_argument("--device cuda: " + card.reason);
    return card.free_bytes / std::max(1, world_size);
  }
  if (device != "cpu")
    throw std::invalid_argument("--gpu-mem auto is not known for device '" + device + "'");
  return host_memory_for_gpus() / std::max(1, world_size);
}

DeviceMesh::DeviceMesh(const MeshOptions& options)
    : options_(options), host_(host_memory_for_gpus()),
      world_(options.world_size, options.comm_timeout, &clock_) {
  if (options_.backend != "sim" && options_.backend != "c10d")
    throw std::invalid_argument("--backend must be sim or c10d, not '" + options_.backend + "'");
  if (options_.backend == "c10d") {
    if (const std::string why = c10d_device_refusal(options_.device); !why.empty())
      throw std::invalid_argument(why);
    if (options_.c10d.world_size != options_.world_size)
      throw std::invalid_argument(fmt::format("WORLD_SIZE is {} but --gpus is {}",
                                              options_.c10d.world_size, options_.world_size));
    // NCCL refuses two ranks on one card ("Duplicate GPU detected"), and this process's rank
    // runs on the first card it sees: with several processes on a host, each must be shown
    // its own.
    const auto cards = options_.device == "cpu" ? 1 : torch::cuda::device_count();
    if (options_.processes_per_host > 1 && cards != 1)
      throw std::invalid_argument(fmt::format(
          "--backend c10d --device cuda: each of the {} processes on this host needs a card of "
          "its own, and this one sees {}: give each process one card with CUDA_VISIBLE_DEVICES "
          "(srun --gpus-per-task=1 does); on one card, use --backend sim",
          options_.processes_per_host, cards));
  }
  // The GPUs that split the physical device: all of them in one process; with c10d, the
  // processes sharing the host's cores and memory, or on CUDA none (a card per process).
  int sharing = options_.world_size;
  if (options_.backend == "c10d")
    sharing = options_.device == "cpu" ? options_.processes_per_host : 1;
  if (options_.backend == "c10d") {
    C10dOptions c = options_.c10d;
    c.timeout = options_.comm_timeout;
    c.device = options_.device == "cpu" ? "cpu" : "cuda";
    c10d_ = std::make_unique<C10dWorld>(c, clock_);
  }
  const bool automatic = options_.capacity_bytes <= 0;
  if (automatic)
    options_.capacity_bytes = auto_capacity(options_.device, sharing);
  if (c10d_) {
    // Processes start at different moments and see different free memory: with --gpu-mem
    // auto every rank takes the smallest share any of them saw, so all GPUs of the run have
    // one capacity. Every process offers, auto or not, so that processes whose --gpu-mem
    // differs all reach the configuration check that refuses them.
    const auto offers = c10d_->all_gather("gpu-mem", std::to_string(options_.capacity_bytes));
    if (automatic)
      for (const std::string& other : offers)
        options_.capacity_bytes = std::min<int64_t>(options_.capacity_bytes, std::stoll(other));
  }
  // Meta tensors take no host memory: a plan's GPUs are bounded by their own capacity only.
  const bool meta = options_.device == "meta";
  if (meta)
    register_meta_kernels();
  // Meta tensors take no memory, and a card's virtual GPUs live in the card: only CPU
  // virtual GPUs share the host's budget.
  const bool on_host = options_.device == "cpu";
  for (int r = 0; r < options_.world_size; ++r)
    gpus_.push_back(
        std::make_unique<VirtualGpu>(r, options_.capacity_bytes, on_host ? &host_ : nullptr));
  windows_.resize(gpus_.size());
  // A run that runs out of memory keeps the instant it did in memory.csv (and so memory.png):
  // every GPU's live bytes as the allocation failed, before the ranks unwind and free them.
  for (auto& g : gpus_)
    g->set_on_out_of_memory([this, rank = g->rank()] {
      sample_memory(last_sampled_step_.load(), "out of memory", rank);
    });
  if (options_.history_steps > 0 && on_host)
    for (auto& g : gpus_) {
      histories_.push_back(std::make_unique<AllocationHistory>(clock_.start()));
      g->set_history(histories_.back().get());
    }
  if (on_card()) {
    streams_.reserve(gpus_.size());
    for (auto& g : gpus_) {
      g->mark_on_card();
      streams_.push_back(RankStream::create());
      pools_.push_back(std::make_unique<CudaPool>(*g, streams_.back().handle()));
    }
  } else {
    streams_.resize(gpus_.size());
  }
  // Only a CUDA run asks for NVML: a CPU run never opens the library or pays for a sample.
  if (options_.timeline && options_.device.rfind("cuda", 0) == 0) {
    Nvml& nvml = options_.nvml ? *options_.nvml : Nvml::instance();
    nvml_index_ = nvml_card(nvml, options_.device);
    if (nvml_index_ >= 0)
      nvml_ = &nvml;
  }
}

std::vector<int> DeviceMesh::local_ranks() const {
  if (c10d_)
    return {c10d_->rank()};
  std::vector<int> all(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r)
    all[r] = r;
  return all;
}

std::unique_ptr<Communicator> DeviceMesh::make_communicator(int rank) {
  if (c10d_) {
    if (rank != c10d_->rank())
      throw std::invalid_argument(
          fmt::format("rank {} runs in another process (this one is rank {})", rank,
                      c10d_->rank()));
    return c10d_->make_communicator();
  }
  auto comm = world_.make_communicator(rank);
  if (options_.device == "meta")
    return std::make_unique<RecordOnlyCommunicator>(std::move(comm), clock_, options_.p2p_route);
  return comm;
}

void DeviceMesh::sample_memory(int64_t step, const std::string& phase, int rank) {
  if (!options_.timeline)
    return;
  MemorySample s;
  s.time_s = clock_.now();
  s.step = step;
  s.phase = phase;
  s.rank = rank;
  auto read = [&s](const VirtualGpu& g) {
    s.bytes.push_back(g.current_bytes());
    s.by_category.push_back(g.current_by_category());
  };
  if (options_.timeline_gpus.empty()) {
    s.bytes.reserve(gpus_.size());
    s.by_category.reserve(gpus_.size());
    for (const auto& g : gpus_) read(*g);
  } else {
    // A GPU listed twice is read once: its ranks run on while the sample is taken.
    const std::vector<int>& listed = options_.timeline_gpus;
    for (size_t i = 0; i < listed.size(); ++i) {
      const auto end = listed.begin() + static_cast<std::ptrdiff_t>(i);
      const auto j =
          static_cast<size_t>(std::find(listed.begin(), end, listed[i]) - listed.begin());
      if (j == i) {
        read(*gpus_.at(static_cast<size_t>(listed[i])));
        continue;
      }
      s.bytes.push_back(s.bytes[j]);
      s.by_category.push_back(s.by_category[j]);
    }
  }
  if (nvml_ != nullptr) {
    if (const auto card = nvml_->sample(nvml_index_)) {
      s.phys_used_bytes = card->used_bytes;
      s.phys_util_pct = card->util_pct;
    }
  }
  last_sampled_step_.store(step);
  if (!histories_.empty() && step >= 1)
    forget_old_steps(step, s.time_s);
  timeline_.add(std::move(s));
}

// The histories keep the last history_steps steps: once step s is sampled, what happened up
// to the end of step s - history_steps is dropped.
void DeviceMesh::forget_old_steps(int64_t step, double time_s) {
  std::lock_guard<std::mutex> lock(history_mutex_);
  if (step <= forgotten_through_)
    return; // a late sample of a step already dropped (another rank was behind)
  double& end = step_ends_[step];
  end = std::max(end, time_s);
  const auto old = step_ends_.find(step - options_.history_steps);
  if (old == step_ends_.end())
    return;
  for (auto& h : histories_) h->drop_before(old->second);
  forgotten_through_ = old->first;
  step_ends_.erase(step_ends_.begin(), std::next(old));
}

void DeviceMesh::close_window(int rank, const std::string& phase) {
  if (!options_.peak_windows)
    return;
  VirtualGpu& g = gpu(rank);
  windows_.at(static_cast<size_t>(rank)).push_back({phase, g.stats()});
  g.reset_peaks();
}

MemoryStats DeviceMesh::peak_stats(int rank) const {
  MemoryStats stats = gpu(rank).stats();
  if (!options_.peak_windows)
    return stats;
  stats.peak = 0;
  stats.peak_by_category.fill(0);
  for (const PeakWindow& w : windows(rank)) {
    stats.peak = std::max(stats.peak, w.stats.peak);
    for (size_t c = 0; c < stats.peak_by_category.size(); ++c)
      stats.peak_by_category[c] = std::max(stats.peak_by_category[c], w.stats.peak_by_category[c]);
  }
  return stats;
}

} // namespace meshsim
