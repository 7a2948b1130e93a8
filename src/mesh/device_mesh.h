// DeviceMesh: the virtual GPUs of a run, their communicator world, clock and memory timeline.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/c10d_backend.h"
#include "comm/recorder.h"
#include "comm/sim_backend.h"
#include "device/physical_device.h"
#include "memory/allocation_history.h"
#include "memory/cuda_allocator.h"
#include "memory/timeline.h"
#include "memory/virtual_gpu.h"

namespace meshsim {

class Nvml;

/// The peaks of one GPU between two of its rank's memory samples.
struct PeakWindow {
  std::string phase; // the sample that closed the window
  MemoryStats stats; // peak and peak_by_category: the window's own
};

struct MeshOptions {
  int world_size = 4;
  int64_t capacity_bytes = 0; // per virtual GPU; 0 = auto (host memory split evenly)
  /// "cpu"; "cuda": the virtual GPUs are carved out of CUDA card 0, each with its own stream
  /// and memory pool (memory/cuda_allocator.h), and each memory sample also reads the card
  /// through NVML (device/nvml.h); or "meta" for plans: tensors have shapes and no storage, the
  /// GPUs are charged what they would hold (not the host), and collectives only record
  /// (comm/record_only.h).
  std::string device = "cpu";
  std::chrono::milliseconds comm_timeout{60000};
  /// "sim": every rank is a thread of this process and collectives move data between them
  /// (comm/sim_backend.h). "c10d": this process runs rank `c10d.rank` of `world_size` alone,
  /// its collectives through c10d (comm/c10d_backend.h); the mesh joins the rendezvous when
  /// it is made, and its other GPUs stay empty.
  std::string backend = "sim";
  C10dOptions c10d;  // with backend c10d: rank, rendezvous (timeout: comm_timeout)
  int processes_per_host = 1;  // with backend c10d: the ranks sharing this host's cores
  bool timeline = true; // sample_memory() keeps memory.csv rows (off for plans of many GPUs)
  /// The GPUs a sample reads, in this order (a plan's: one per pipeline stage, of thousands);
  /// empty: every GPU, sample.bytes[g] being GPU g's.
  std::vector<int> timeline_gpus;
  /// Each rank's memory.csv sample also closes a window of its GPU's peaks (close_window):
  /// plans carry each phase's peak to larger models (plan/search.h).
  bool peak_windows = false;
  Nvml* nvml = nullptr; // where a CUDA run reads the card; null: Nvml::instance()
  /// --memory-snapshot: every GPU keeps its allocations and frees of the last this many
  /// training steps (memory/allocation_history.h); 0: none kept. CPU runs only.
  int history_steps = 0;
  /// Plans: where a point-to-point message for a rank that does not run is delivered
  /// (plan/stage_images.h); null: to that rank.
  P2pRoute p2p_route;
};

/// The memory the physical device can give split evenly over `world_size` virtual GPUs: on
/// the CPU what the host can give (host_memory_for_gpus: available less a headroom), on CUDA
/// the card's free memory.
int64_t auto_capacity(const std::string& device, int world_size);

class DeviceMesh {
public:
  explicit DeviceMesh(const MeshOptions& options);

  int world_size() const { return options_.world_size; }
  const std::string& device() const { return options_.device; }
  /// The processes sharing this host's cores (1 unless backend c10d).
  int processes_per_host() const {
    return options_.backend == "c10d" ? std::max(1, options_.processes_per_host) : 1;
  }
  bool on_card() const { return options_.device == "cuda"; }
  /// Rank `rank`'s CUDA stream (invalid off the card).
  const RankStream& stream(int rank) const { return streams_.at(rank); }
  /// Rank `rank`'s memory pool on the card (null off the card).
  const CudaPool* pool(int rank) const { return pools_.empty() ? nullptr : pools_.at(rank).get(); }
  VirtualGpu& gpu(int rank) { return *gpus_.at(rank); }
  const VirtualGpu& gpu(int rank) const { return *gpus_.at(rank); }
  SimWorld& comm_world() { return world_; }
  /// Rank `rank`'s communicator: the in-process backend, record-only on the meta device,
  /// c10d's for this process's rank with backend c10d.
  std::unique_ptr<Communicator> make_communicator(int rank);
  /// The ranks this process runs: all of them, or with backend c10d its own.
  std::vector<int> local_ranks() const;
  /// The processes of the run with backend c10d (null otherwise).
  C10dWorld* c10d_world() { return c10d_.get(); }
  MemoryTimeline& timeline() { return timeline_; }
  const MemoryTimeline& timeline() const { return timeline_; }
  const RunClock& clock() const { return clock_; }

  /// Appends one memory.csv row: every GPU's live bytes now (by category too), the rank whose
  /// phase ended, and on CUDA the card's NVML reading.
  void sample_memory(int64_t step, const std::string& phase, int rank = -1);

  /// With MeshOptions::peak_windows: ends the window of `rank`'s GPU that its previous call (or
  /// the mesh's start) opened, keeping the window's peaks under `phase`, and opens the next.
  /// Called from `rank`'s own thread only (its windows are its own, as its Recorder is); read
  /// windows() after the rank threads are joined. The GPU's own peaks then cover the last
  /// window only: the whole run's are the largest of the windows'.
  void close_window(int rank, const std::string& phase);
  const std::vector<PeakWindow>& windows(int rank) const { return windows_.at(rank); }
  /// `rank`'s GPU stats over the whole run: with windows kept, the peaks are the largest of
  /// the windows' (the GPU's own cover only the last); otherwise the GPU's own.
  MemoryStats peak_stats(int rank) const;
  /// `rank`'s allocation history (MeshOptions::history_steps); null when none is kept.
  const AllocationHistory* history(int rank) const {
    return histories_.empty() ? nullptr : histories_.at(rank).get();
  }

private:
  void forget_old_steps(int64_t step, double time_s);

  // Outlives gpus_ (declared before them), whose allocations it records.
  std::vector<std::unique_ptr<AllocationHistory>> histories_;
  MeshOptions options_;
  RunClock clock_;
  std::atomic<int64_t> last_sampled_step_{0}; // the step of memory.csv's latest row
  HostBudget host_; // all GPUs together live in the host's memory
  std::vector<std::unique_ptr<VirtualGpu>> gpus_;
  std::vector<RankStream> streams_;
  std::vector<std::unique_ptr<CudaPool>> pools_; // after gpus_: detached before they go
  SimWorld world_;
  std::unique_ptr<C10dWorld> c10d_;  // backend c10d: after clock_, which it reads
  MemoryTimeline timeline_;
  std::vector<std::vector<PeakWindow>> windows_; // per rank, written by its own thread
  Nvml* nvml_ = nullptr; // set with nvml_index_ on a CUDA run whose card NVML can read
  int nvml_index_ = -1;  // that card's NVML index; -1: no card columns (not CUDA, no NVML)
  std::mutex history_mutex_;
  std::map<int64_t, double> step_ends_; // the last sample's time of each step (histories kept)
  int64_t forgotten_through_ = 0;        // the steps the histories no longer hold
};

} // namespace meshsim
