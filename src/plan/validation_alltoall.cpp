// The all-to-all rows of `meshsim validate`: what mixture-of-experts layers exchange, held
// against nccl-tests' alltoall_perf on H100 and DeepEP's dispatch and combine on H800.
#include <fmt/format.h>

#include "cost/collective_cost.h"
#include "plan/validation_rows.h"

namespace meshsim {
namespace {

constexpr double kMB = 1e6;

// nccl-tests' bus bandwidth of one even all_to_all of `bytes` per rank over `nodes` x
// `per_node` GPUs of `gpu`, in GB/s.
double all_to_all_busbw(const char* gpu, int nodes, int per_node, double bytes) {
  const ClusterSpec cluster = parse_cluster_spec(fmt::format("{}x8x{}", nodes, gpu));
  const GroupShape shape = nodes > 1 ? GroupShape::across(nodes, per_node)
                                     : GroupShape::within_node(per_node);
  const double t = collective_cost(CollectiveOp::AllToAll, bytes, shape, cluster).time_s;
  return bandwidths(CollectiveOp::AllToAll, shape.ranks, bytes, t).busbw / 1e9;
}

// DeepEP's "bottleneck bandwidth" of a dispatch or combine of `bytes` per GPU over `ep` H800s
// (8 a node): the bytes that cross the bottleneck link (NVLink within one node, the GPU's
// RDMA NIC across nodes) ÷ the time, in GB/s. meshsim times it as an even all_to_all: each
// token goes to each of its experts' GPUs (DeepEP sends a token once to each node it needs and
// forwards it over NVLink there, which meshsim does not model).
double deepep_bandwidth(int ep, double bytes) {
  const int nodes = ep > 8 ? ep / 8 : 1;
  const ClusterSpec cluster = parse_cluster_spec(fmt::format("{}x8xh800", nodes));
  const GroupShape shape = nodes > 1 ? GroupShape::across(nodes, 8) : GroupShape::within_node(ep);
  const double t = collective_cost(CollectiveOp::AllToAll, bytes, shape, cluster).time_s;
  const double crossing = nodes > 1 ? bytes * (ep - 8) / ep : bytes * (ep - 1) / ep;
  return crossing / t / 1e9;
}

} // namespace

std::vector<PublishedRow> all_to_all_rows() {
  std::vector<PublishedRow> rows;
  rows.push_back({"nccl-tests", kFamilyCollectives,
                  "4xH100 SXM 80GB, NVSwitch, alltoall 500 MB (GB/s busbw)",
                  "NVIDIA/nccl #2169 (alltoall_perf, NCCL 2.30.4)", "GB/s busbw", 334.9, 334.9, "",
                  [] { return all_to_all_busbw("h100", 1, 4, 524288000); }});
  // DeepEP's normal kernels (DeepSeek-V3's pretraining setting: 4,096 tokens a batch, hidden
  // 7,168, top 8 of the experts, FP8 dispatch, BF16 combine) on H800 with one CX7 400 Gb/s NIC
  // per GPU.
  const double tokens = 4096 * 8;
  const double dispatch = tokens * 7168 * 1, combine = tokens * 7168 * 2;
  struct Row {
    int ep;
    double dispatch_gbs, combine_gbs;
  };
  for (const Row& r : {Row{8, 153, 158}, Row{16, 43, 43}, Row{32, 58, 57}, Row{64, 51, 50}}) {
    const char* link = r.ep > 8 ? "RDMA" : "NVLink";
    for (const auto& [what, bytes, published] :
         {std::tuple<const char*, double, double>{"dispatch (FP8)", dispatch, r.dispatch_gbs},
          {"combine (BF16)", combine, r.combine_gbs}})
      rows.push_back({"DeepEP", kFamilyCollectives,
                      fmt::format("EP{} {} on H800, {:.0f} MB a GPU ({} GB/s)", r.ep, what,
                                  bytes / kMB, link),
                      "deepseek-ai/DeepEP README, normal kernels (commit 3b1045d)", "GB/s", published,
                      published, "", [ep = r.ep, b = bytes] { return deepep_bandwidth(ep, b); }});
  }
  return rows;
}

} // namespace meshsim
