// `--memory-snapshot`: each virtual GPU's allocation history as PyTorch's memory snapshot, the
// pickle torch.cuda.memory._dump_snapshot writes, so PyTorch's own viewers open it
// (torch.cuda._memory_viz, https://pytorch.org/memory_viz).
//
// A snapshot is the dict torch.cuda.memory._snapshot() returns (2.x):
//   segments       the blocks live at the end of the last training step (its last memory
//                  sample; what came after, the final evaluation, is undone), one segment per block (meshsim's
//                  allocator has no segments: each allocation is its own), each block with
//                  its `history` as PyTorch 1.13's viewers read it;
//   device_traces  one list (the virtual GPU) of events over the last steps kept, up to that
//                  end: `alloc`,
//                  and for a free `free_requested` then `free_completed`, with addr, size,
//                  stream 0 and time_us.
// Every block and event carries two frames, shown where PyTorch shows a stack: its category
// ({"name": "activations", "filename": "category", "line": 0}) and its phase, the phase of its
// rank that ended next ({"name": "backward", "filename": "step", "line": 7}).
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/recorder.h"
#include "memory/allocation_history.h"
#include "memory/timeline.h"

namespace meshsim {

class DeviceMesh;

/// The snapshot of virtual GPU `rank` from its history and the run's memory samples (which
/// name the phases).
nlohmann::json memory_snapshot(const AllocationHistory& history,
                               const std::vector<MemorySample>& samples, int rank);

/// Writes `dir`/gpuN.pickle for every GPU of `mesh` that kept a history, each atomically.
void write_memory_snapshots(const std::filesystem::path& dir, const DeviceMesh& mesh);

} // namespace meshsim
