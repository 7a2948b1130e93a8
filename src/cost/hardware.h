// Hardware presets for the cost model: GPUs, links, and the cluster spec that combines them.
//
// The cost model predicts how long work recorded on virtual GPUs would take on a real cluster;
// these tables are its only source of hardware numbers. FLOP/s and line rates are vendor
// peaks (dense, no sparsity); what kernels and collectives achieve of them is a factor beside
// each (LinkSpec::efficiency here, the Efficiency table in roofline.h), with its source.
// See docs/cost-model.md for sources and assumptions.
#pragma once

#include <string>
#include <vector>

namespace meshsim {

/// Numeric type of the math. TF32 is an fp32 storage format with tensor-core math; FP8 is
/// E4M3/E5M2 tensor-core math with fp32 accumulate (Hopper and later, Ada).
enum class Dtype { FP32, TF32, BF16, FP16, FP8 };

Dtype parse_dtype(const std::string& name); // "fp32", "tf32", "bf16", "fp16", "fp8"
const char* to_string(Dtype dtype);
/// Storage bytes per element (TF32 is stored as fp32, FP8 in one byte).
double dtype_bytes(Dtype dtype);

/// The GPU's architecture: it sets the default links of its servers (default_intra_link) and
/// whether it has FP8 tensor cores.
enum class GpuArch { Volta, Turing, Ampere, Ada, Hopper, Blackwell };
const char* to_string(GpuArch arch);

/// One GPU model. FLOP/s are dense peaks: tensor-core rates for tf32/bf16/fp16 where the
/// GPU has them, the CUDA-core rate otherwise (see hardware.cpp for the fallbacks). FP8 is 0
/// on GPUs without FP8 tensor cores: a plan at fp8 is refused there.
struct GpuSpec {
  std::string name;
  GpuArch arch = GpuArch::Ampere;
  double fp32_flops = 0; // CUDA-core FP32, FLOP/s
  double tf32_flops = 0; // FLOP/s
  double bf16_flops = 0; // FLOP/s, FP32 accumulate
  double fp16_flops = 0; // FLOP/s, FP32 accumulate
  double fp8_flops = 0;  // FLOP/s, FP32 accumulate; 0: no FP8 tensor cores
  double mem_bw = 0;     // bytes/s, device memory
  double mem_bytes = 0;  // capacity, bytes

  double peak_flops(Dtype dtype) const;
};

/// What a link is made of: it picks NCCL's per-hop latencies (collective_cost.cpp).
enum class LinkKind { NVLink, PCIe, Network };

/// One interconnect. `bandwidth` is the line rate per GPU (for a network: per NIC), per
/// direction (see docs: a ring step sends and receives at once, so the unidirectional rate is
/// what bounds it). `efficiency` is the share of it that NCCL's bandwidth-bound protocol
/// (Simple) achieves on large messages; hardware.cpp says where each comes from.
struct LinkSpec {
  std::string name;
  double bandwidth = 0;   // bytes/s, one direction, one GPU (network: one NIC)
  double efficiency = 1;  // achieved / line rate, large messages
  LinkKind kind = LinkKind::NVLink;
  /// NVLink SHARP: an NVSwitch that reduces in the switch (H100/H200 HGX). NCCL's NVLS
  /// all-reduce then moves each byte to the switch and back once, whatever the group size, at
  /// this share of the line rate. 0: the switch cannot.
  double nvls_efficiency = 0;

  double achieved() const { return bandwidth * efficiency; }
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
  LinkSpec inter; // between nodes, one NIC
  /// NICs per node; 0: one per GPU ("rails", as DGX/HGX systems). With fewer, a node's GPUs
  /// share them: every GPU of a node talks across nodes at once in a data-parallel step.
  int nics_per_node = 0;
  std::string note; // set when the spec named a GPU by its bare name ("a100 taken as a100-80")

  int world_size() const { return nodes * gpus_per_node; }
  int node_of(int rank) const { return rank / gpus_per_node; }
  int nics() const { return nics_per_node > 0 ? nics_per_node : gpus_per_node; }
  /// One GPU's achieved share of the node's network: inter.achieved() x min(1, NICs / GPUs).
  double inter_per_gpu() const;
  std::string to_string() const; // "4x8xh100 (intra nvlink4, inter ndr)", "... inter 4xhdr)"
};

/// Parses "NODESxGPUSxMODEL" ("4x8xh100"), "GPUSxMODEL" (one node, "8xa100-80") or "MODEL"
/// (one GPU). Empty overrides keep the GPU's default links. `inter_override` may name the NIC
/// count per node too: "4xhdr" is 4 HDR NICs shared by the node's GPUs. Errors are
/// std::invalid_argument with a one-line message.
ClusterSpec parse_cluster_spec(const std::string& spec, const std::string& intra_override = "",
                               const std::string& inter_override = "");

} // namespace meshsim
