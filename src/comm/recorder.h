// Recorder: what one rank did, kept for the report and the cost model.
//
// Each rank owns one Recorder and is the only thread writing to it; the main thread reads
// it after the rank threads have been joined. Its communicator records every collective it
// calls; its strategy records compute regions. Memory samples are kept apart, in the shared
// MemoryTimeline (memory/timeline.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace meshsim {

/// Seconds since the run's clock started (steady clock).
class RunClock {
public:
  RunClock() : start_(std::chrono::steady_clock::now()) {}
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  std::chrono::steady_clock::time_point start() const { return start_; }

private:
  std::chrono::steady_clock::time_point start_;
};

struct CollectiveRecord {
  std::string op;          // all_reduce, broadcast, all_gather, reduce_scatter, reduce, all_to_all,
                           // send, recv, barrier
  std::vector<int> group;  // global ranks, in group order
  int64_t bytes = 0;       // payload per rank (the input tensor's size)
  int64_t seq = 0;         // sequence number within the group (per peer pair for send/recv)
  int peer = -1;           // send/recv peer
  double start_s = 0;
  double end_s = 0;
  // The rank thread's thread_charge_count() at start and end (-1: not recorded).
  int64_t start_charges = -1;
  int64_t end_charges = -1;
  // A collective started with *_async: when the rank waited for it (-1: a blocking call).
  // It ran in [start_s, end_s] while the rank computed; the rank's program reaches it at
  // waited_s, where its charge counts are taken.
  double waited_s = -1;
  // all_to_all: the bytes this rank sent to each member, in group order (its own share
  // included; `bytes` is their sum); empty for every other op. Last, so that positional
  // initializers of the fields above stay valid.
  std::vector<int64_t> peer_bytes{};
};

/// The work of one layer inside a compute region, counted from shapes (models/layers/flops.h).
struct LayerWork {
  std::string layer;        // module name, e.g. "conv1"
  std::string op;           // op class: matmul, attention, normalization, elementwise, optimizer
  double flops = 0;
  double bytes = 0;         // device-memory traffic, read + written
  int64_t param_bytes = 0;  // bytes of this layer's parameters (whose gradients it produces)
  // Of flops and bytes: the attention core's share (QKᵀ and attention over V), what selective
  // recomputation runs again.
  double attention_flops = 0;
  double attention_bytes = 0;
  // In a forward: the part of it that this layer's backward runs again (--recompute).
  double rerun_flops = 0;
  double rerun_bytes = 0;
  // In a forward: what op-level recomputation (--recompute op) keeps rather than runs again:
  // the kept Linears' GEMMs, and a fused attention core's (one kernel); `keeps_matmuls` when
  // the layer is recomputed that way (its backward runs the rest of its forward again).
  double kept_flops = 0;
  double kept_bytes = 0;
  int64_t kept_gemms = 0;
  double kept_core_flops = 0;
  double kept_core_bytes = 0;
  bool keeps_matmuls = false;
  // In a backward: the forward work it ran again, included in flops and bytes.
  double recompute_flops = 0;
  double recompute_bytes = 0;
  // Kernels the layer's pass launches, and of them the GEMMs (matmul, convolution, the
  // attention core) with their share of flops and bytes: the cost model times GEMMs by their
  // size and the rest as memory bound, and charges every launch. 0 in older records.
  int64_t kernels = 0;
  int64_t gemms = 0;
  double gemm_flops = 0;
  double gemm_bytes = 0;
  // The attention score matrices' traffic, were the attention core not one fused kernel
  // (models/layers/flops.h); not in `bytes`.
  double score_bytes = 0;
};

struct ComputeRecord {
  std::string name;  // forward, backward, optimizer, ...
  int64_t step = 0;
  double start_s = 0;
  double end_s = 0;
  // Counted work (0 / empty when the region was not counted). `layers` is in execution
  // order: a backward lists the layers last to first, which is the order gradients appear.
  double flops = 0;
  double bytes = 0;
  std::string op{};  // the op class of most of the FLOPs
  std::vector<LayerWork> layers{};
  double recompute_flops = 0;  // of flops: forward work recomputed in a backward
  int64_t start_charges = -1;  // as CollectiveRecord's
  int64_t end_charges = -1;
};

struct Recorder {
  std::vector<CollectiveRecord> collectives;
  std::vector<ComputeRecord> compute;
};

} // namespace meshsim
