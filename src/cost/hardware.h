// Hardware presets for the cost model: GPUs, links, and the cluster spec that combines them.
//
// The cost model predicts how long work recorded on virtual GPUs would take on a real cluster;
// these tables are its only source of hardware numbers. Every number is a vendor peak (dense,
// no sparsity); the efficiency factors in roofline.h are where achieved-vs-peak lives.
// See docs/cost-model.md for sources and assumptions.
#pragma once

#include <string>
#include <vector>

namespace meshsim {

/// Numeric type of the math. TF32 is an fp32 storage format with tensor-core math.
enum class Dtype { FP32, TF32, BF16, FP16 };

Dtype parse_dtype(const std::string& name); // "fp32", "tf32", "bf16", "fp16"
const char* to_string(Dtype dtype);
/// Storage bytes per element (TF32 is stored as fp32).
double dtype_bytes(Dtype dtype);

/// One GPU model. FLOP/s are dense peaks: tensor-core rates for tf32/bf16/fp16 where the
/// GPU has them, the CUDA-core rate otherwise (see hardware.cpp for the fallbacks).
struct GpuSpec {
  std::string name;
  double fp32_flops = 0; // CUDA-core FP32, FLOP/s
  double tf32_flops = 0; // FLOP/s
  double bf16_flops = 0; // FLOP/s, FP32 accumulate
  double fp16_flops = 0; // FLOP/s, FP32 accumulate
  double mem_bw = 0;     // bytes/s, device memory
  double mem_bytes = 0;  // capacity, bytes

  double peak_flops(Dtype dtype) const;
};

/// One interconnect. `bandwidth` is per GPU, per direction (see docs: a ring step sends and
/// receives at once, so the unidirectional rate is what bounds it). `latency` is the per-hop
/// α of the α–β model.
struct LinkSpec {
  std::string name;
  double bandwidth = 0; // bytes/s, one direction, one GPU
  double latency = 0;   // seconds per hop
};

const std::vector<GpuSpec>& gpu_presets();
const std::vector<LinkSpec>& link_presets();
/// Lookup by name (case-insensitive); std::invalid_argument listing the known names otherwise.
GpuSpec gpu_preset(const std::string& name);
LinkSpec link_preset(const std::string& name);

/// Default links for a GPU model: how such GPUs are usually built into servers and clusters.
std::string default_intra_link(const std::string& gpu_name);
std::string default_inter_link(const std::string& gpu_name);

/// The target cluster: `nodes` servers of `gpus_per_node` identical GPUs. Global rank r lives
/// on node r / gpus_per_node (ranks are packed node by node, as torchrun does).
struct ClusterSpec {
  int nodes = 1;
  int gpus_per_node = 1;
  GpuSpec gpu;
  LinkSpec intra; // between GPUs of one node
  LinkSpec inter; // between nodes; one NIC per GPU ("rail") assumed, see docs
  std::string note; // set when the spec named a GPU by its bare name ("a100 taken as a100-80")

  int world_size() const { return nodes * gpus_per_node; }
  int node_of(int rank) const { return rank / gpus_per_node; }
  std::string to_string() const; // "4x8xh100 (intra nvlink4, inter ndr)"
};

/// Parses "NODESxGPUSxMODEL" ("4x8xh100"), "GPUSxMODEL" (one node, "8xa100-80") or "MODEL"
/// (one GPU). Empty overrides keep the GPU's default links. Errors are std::invalid_argument
/// with a one-line message.
ClusterSpec parse_cluster_spec(const std::string& spec, const std::string& intra_override = "",
                               const std::string& inter_override = "");

} // namespace meshsim
