// Runs one thread per rank. Each thread makes its virtual GPU current, so every tensor it
// allocates is charged there, and gets its own Communicator and Recorder.
//
// If a rank fails, the communicator world is aborted so no other rank waits for it; the
// run then rethrows the first real failure (never the secondary "aborted" ones).
#pragma once

#include <functional>
#include <stdexcept>
#include <vector>

#include "comm/communicator.h"
#include "comm/recorder.h"
#include "mesh/device_mesh.h"

namespace meshsim {

/// Thrown by a rank that leaves the run on purpose (fault injection): its thread ends
/// quietly and the other ranks find out the way they would on a cluster, by a timeout.
class RankLeft : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct RankContext {
  int rank;
  int world_size;
  VirtualGpu& gpu;
  Communicator& comm;
  Recorder& recorder;
  DeviceMesh& mesh;

  /// Records a memory.csv row (all GPUs) tagged with this rank's step and phase, and closes
  /// this rank's peak window there (DeviceMesh::close_window, when the mesh keeps them).
  void sample_memory(int64_t step, const std::string& phase) {
    mesh.sample_memory(step, phase, rank);
    mesh.close_window(rank, phase);
  }
  /// Where this rank is: the run's clock and its thread's charge count (thread_charge_count).
  struct Mark {
    double s = 0;
    int64_t charges = 0;
  };
  Mark mark() const { return {now(), thread_charge_count()}; }
  /// Records a compute region [start, now] for the trace and the cost model.
  void record_compute(const std::string& name, int64_t step, const Mark& start);
  double now() const { return mesh.clock().now(); }
};

/// Intra-op threads each rank uses so that all ranks together fill the physical cores.
int threads_per_rank(int world_size);

/// The intra-op threads each of this process's ranks runs with when all of them run: the
/// host's cores shared among its local ranks and those of the host's other processes.
int threads_per_local_rank(const DeviceMesh& mesh);

/// Runs `fn` on every rank of this process (DeviceMesh::local_ranks) and returns each rank's
/// Recorder (with its collective records); another process's ranks' are empty.
std::vector<Recorder> run_ranks(DeviceMesh& mesh, const std::function<void(RankContext&)>& fn);

/// The same on the ranks listed in `only` (plans run one rank per symmetry class); the
/// Recorders of the others are empty.
std::vector<Recorder> run_ranks(DeviceMesh& mesh, const std::function<void(RankContext&)>& fn,
                                const std::vector<int>& only);

} // namespace meshsim
