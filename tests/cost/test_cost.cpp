// Tests for the pure cost model: hardware presets, cluster-spec parsing, collective α–β
// formulas and bus bandwidth, and the roofline. Every expectation is a hand-derived value.
#include <cmath>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "cost/collective_cost.h"
#include "cost/hardware.h"
#include "cost/roofline.h"

namespace meshsim {
namespace {

LinkSpec test_link(double alpha, double beta) {
  return {"test", beta, alpha};
}

// ---------------------------------------------------------------- hardware and cluster spec

TEST(CostHardware, GpuPresetsAreDenseDatasheetPeaks) {
  const GpuSpec a100 = gpu_preset("a100-80");
  EXPECT_DOUBLE_EQ(a100.fp32_flops, 19.5e12);
  EXPECT_DOUBLE_EQ(a100.peak_flops(Dtype::TF32), 156e12);
  EXPECT_DOUBLE_EQ(a100.peak_flops(Dtype::BF16), 312e12);
  EXPECT_DOUBLE_EQ(a100.mem_bw, 2039e9);
  EXPECT_DOUBLE_EQ(gpu_preset("a100-40").mem_bw, 1555e9);
  // H100 datasheet quotes 1979 TF bf16 "with sparsity": dense is half.
  EXPECT_DOUBLE_EQ(gpu_preset("h100").peak_flops(Dtype::BF16), 989.5e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h200").peak_flops(Dtype::FP16), 989.5e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h200").mem_bytes, 141e9);
  EXPECT_DOUBLE_EQ(gpu_preset("l4").peak_flops(Dtype::TF32), 60e12);
  // Volta has no bf16 tensor cores: bf16 runs at the fp32 rate, fp16 on tensor cores.
  const GpuSpec v100 = gpu_preset("V100-32");
  EXPECT_DOUBLE_EQ(v100.peak_flops(Dtype::BF16), v100.fp32_flops);
  EXPECT_DOUBLE_EQ(v100.peak_flops(Dtype::FP16), 125e12);
  EXPECT_EQ(gpu_presets().size(), 9u);
  for (const GpuSpec& gpu : gpu_presets()) {
    EXPECT_GE(gpu.peak_flops(Dtype::BF16), gpu.fp32_flops) << gpu.name;
    EXPECT_GT(gpu.mem_bw, 0) << gpu.name;
  }
}

TEST(CostHardware, LinkBandwidthIsPerGpuPerDirection) {
  EXPECT_DOUBLE_EQ(link_preset("nvlink2").bandwidth, 150e9); // "300 GB/s" bidirectional
  EXPECT_DOUBLE_EQ(link_preset("nvlink3").bandwidth, 300e9); // "600 GB/s"
  EXPECT_DOUBLE_EQ(link_preset("nvlink4").bandwidth, 450e9); // "900 GB/s"
  EXPECT_DOUBLE_EQ(link_preset("pcie3").bandwidth, 8e9 * 16 * 128 / 130 / 8);
  EXPECT_DOUBLE_EQ(link_preset("pcie4").bandwidth, 2 * link_preset("pcie3").bandwidth);
  EXPECT_DOUBLE_EQ(link_preset("pcie5").bandwidth, 2 * link_preset("pcie4").bandwidth);
  EXPECT_DOUBLE_EQ(link_preset("hdr").bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(link_preset("ndr").bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(link_preset("100gbe").bandwidth, 12.5e9);
  EXPECT_LT(link_preset("nvlink4").latency, link_preset("ndr").latency);
}

TEST(CostClusterSpec, ParsesNodesGpusAndModel) {
  const ClusterSpec big = parse_cluster_spec("4x8xh100");
  EXPECT_EQ(big.nodes, 4);
  EXPECT_EQ(big.gpus_per_node, 8);
  EXPECT_EQ(big.world_size(), 32);
  EXPECT_EQ(big.gpu.name, "h100");
  EXPECT_EQ(big.intra.name, "nvlink4");
  EXPECT_EQ(big.inter.name, "ndr");
  EXPECT_EQ(big.node_of(15), 1);
  EXPECT_EQ(big.to_string(), "4x8xh100 (intra nvlink4, inter ndr)");

  const ClusterSpec one_node = parse_cluster_spec("8xa100-80");
  EXPECT_EQ(one_node.nodes, 1);
  EXPECT_EQ(one_node.gpus_per_node, 8);
  EXPECT_EQ(one_node.intra.name, "nvlink3");
  EXPECT_EQ(one_node.inter.name, "hdr");

  EXPECT_EQ(parse_cluster_spec("v100-16").world_size(), 1);
  EXPECT_EQ(parse_cluster_spec("2x4xv100-32").intra.name, "nvlink2");
  EXPECT_EQ(parse_cluster_spec("8x4090").intra.name, "pcie4");
  EXPECT_EQ(parse_cluster_spec("4xl4").intra.name, "pcie4");
  EXPECT_EQ(parse_cluster_spec("4x2080ti").intra.name, "pcie3");
  EXPECT_EQ(parse_cluster_spec("2x8xH200").inter.name, "ndr");
  EXPECT_EQ(parse_cluster_spec(" 2x8xh200\t").world_size(), 16);
}

TEST(CostClusterSpec, BareGpuNamesTakeTheDocumentedBoardAndSaySo) {
  const ClusterSpec a100 = parse_cluster_spec("8xa100");
  EXPECT_EQ(a100.gpu.name, "a100-80");
  EXPECT_NE(a100.note.find("a100 taken as a100-80"), std::string::npos) << a100.note;
  EXPECT_EQ(parse_cluster_spec("V100").gpu.name, "v100-32");
  EXPECT_TRUE(parse_cluster_spec("8xa100-40").note.empty());
}

TEST(CostClusterSpec, OverridesLinksByName) {
  const ClusterSpec cluster = parse_cluster_spec("2x8xa100-80", "pcie3", "100gbe");
  EXPECT_EQ(cluster.intra.name, "pcie3");
  EXPECT_EQ(cluster.inter.name, "100gbe");
  EXPECT_DOUBLE_EQ(cluster.inter.bandwidth, 12.5e9);
}

TEST(CostClusterSpec, BadSpecsThrowOneLineErrors) {
  const struct {
    const char* spec;
    const char* intra;
    const char* expect; // a fragment the message must contain
  } cases[] = {
      {"", "", "missing GPU model"},
      {"4x8x", "", "missing GPU model"},
      {"0x8xh100", "", "node count 0 must be at least 1"},
      {"4x0xh100", "", "GPUs per node 0 must be at least 1"},
      {"1000000x8xh100", "", "node count 1000000 is more than 100000"},
      {"99999999999999999999x8xh100", "", "is more than 100000"},
      {"1000x1000xh100", "", "1000000 GPUs in all is more than 100000"},
      {"4x8xb200", "", "unknown GPU model \"b200\""},
      {"4xaxh100", "", "unknown GPU model"},
      {"9999999x8xh100", "", "node count 9999999 is more than"},
      {"8xa100-80", "nvlink9", "unknown link \"nvlink9\""},
  };
  for (const auto& c : cases) {
    try {
      parse_cluster_spec(c.spec, c.intra);
      ADD_FAILURE() << "no error for \"" << c.spec << "\"";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c.expect), std::string::npos) << message;
      EXPECT_NE(message.find("invalid cluster spec \"" + std::string(c.spec) + "\""),
                std::string::npos)
          << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
}

// Found by fuzz/fuzz_cluster (fuzz/corpus/fuzz_cluster/crash-control-char-in-link): the spec
// and link names were echoed raw, so a control character in a flag (or in config.json's
// "cluster") broke the one-line error.
TEST(CostClusterSpec, ControlCharactersInErrorsAreEscaped) {
  for (const auto& [spec, intra] : {std::pair<std::string, std::string>{"4x8xh1\n00", ""},
                                    {"8xa100-80", "nv\rlink"},
                                    {std::string("2x\0x", 4) + "h100", ""}}) {
    try {
      parse_cluster_spec(spec, intra);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find_first_of(std::string("\n\r\0", 3)), std::string::npos) << message;
      EXPECT_NE(message.find("\\x"), std::string::npos) << message;
    }
  }
  EXPECT_THROW(parse_dtype("fp\n32"), std::invalid_argument);
}

// ---------------------------------------------------------------- collectives

TEST(CostCollective, RingAllReduceMatchesFormula) {
  const LinkSpec links[] = {test_link(5e-6, 1e11), link_preset("nvlink3"), link_preset("pcie3")};
  for (const LinkSpec& link : links)
    for (int n : {2, 3, 4, 7, 8, 16, 64})
      for (double bytes : {0.0, 1e3, 123456789.0, 1.5e9}) {
        const double alpha = link.latency, beta = link.bandwidth;
        const double expected = 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / beta;
        EXPECT_DOUBLE_EQ(ring_all_reduce_time(n, bytes, link), expected) << n << " " << bytes;
        const CollectiveCost cost =
            collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::within_node(n), link, link,
                            Algorithm::Ring);
        EXPECT_DOUBLE_EQ(cost.time_s, expected);
        EXPECT_FALSE(cost.hierarchical);
      }
}

TEST(CostCollective, TreeFormulaAndAutoPicksFaster) {
  const LinkSpec link = test_link(10e-6, 100e9);
  // n = 5: tree depth ceil(log2 5) = 3.
  EXPECT_DOUBLE_EQ(tree_all_reduce_time(5, 1e6, link), 2 * 3 * 10e-6 + 2 * 1e6 / 100e9);
  const GroupShape eight = GroupShape::within_node(8);
  // Small message: latency dominates, tree (6 α) beats ring (14 α).
  const CollectiveCost small = collective_cost(CollectiveOp::AllReduce, 1024, eight, link, link);
  EXPECT_EQ(small.algorithm, Algorithm::Tree);
  EXPECT_DOUBLE_EQ(small.time_s, tree_all_reduce_time(8, 1024, link));
  // Large message: ring moves 2(n-1)/n B instead of 2 B.
  const CollectiveCost large = collective_cost(CollectiveOp::AllReduce, 1e9, eight, link, link);
  EXPECT_EQ(large.algorithm, Algorithm::Ring);
  EXPECT_DOUBLE_EQ(large.time_s, ring_all_reduce_time(8, 1e9, link));
  // Forcing the slower one is honoured.
  EXPECT_EQ(
      collective_cost(CollectiveOp::AllReduce, 1e9, eight, link, link, Algorithm::Tree).algorithm,
      Algorithm::Tree);
}

TEST(CostCollective, OtherOpsWithinNode) {
  const LinkSpec link = test_link(2e-6, 50e9);
  const double bytes = 8e8;
  const GroupShape six = GroupShape::within_node(6);
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::AllGather, bytes, six, link, link).time_s,
                   5 * 2e-6 + 5.0 / 6 * bytes / 50e9);
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::ReduceScatter, bytes, six, link, link).time_s,
                   5 * 2e-6 + 5.0 / 6 * bytes / 50e9);
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::Broadcast, bytes, six, link, link).time_s,
                   5 * 2e-6 + bytes / 50e9);
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::Reduce, bytes, six, link, link).time_s,
                   5 * 2e-6 + bytes / 50e9);
  EXPECT_DOUBLE_EQ(
      collective_cost(CollectiveOp::SendRecv, bytes, GroupShape::within_node(2), link, link).time_s,
      2e-6 + bytes / 50e9);
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::Barrier, bytes, six, link, link).time_s,
                   2 * 3 * 2e-6); // a zero-byte all_reduce: tree latency 2 ceil(log2 6) α
  EXPECT_DOUBLE_EQ(
      collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::within_node(1), link, link)
          .time_s,
      0.0);
}

TEST(CostCollective, BusBandwidthFollowsNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::AllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::ReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::SendRecv, 2), 1.0);
  const Bandwidths bw = bandwidths(CollectiveOp::AllReduce, 4, 1e9, 0.01);
  EXPECT_DOUBLE_EQ(bw.algbw, 1e11);
  EXPECT_DOUBLE_EQ(bw.busbw, 1e11 * 1.5);

  // The point of busbw: with zero latency, every bandwidth-optimal algorithm's busbw equals
  // the link bandwidth, whatever n.
  const double beta = 40e9;
  const LinkSpec link = test_link(0, beta);
  for (int n : {2, 4, 8, 32}) {
    const GroupShape shape = GroupShape::within_node(n);
    for (CollectiveOp op : {CollectiveOp::AllReduce, CollectiveOp::AllGather,
                            CollectiveOp::ReduceScatter, CollectiveOp::Broadcast}) {
      const double t = collective_cost(op, 1e9, shape, link, link, Algorithm::Ring).time_s;
      EXPECT_NEAR(bandwidths(op, n, 1e9, t).busbw, beta, beta * 1e-12) << to_string(op) << n;
    }
  }
}

TEST(CostCollective, GroupShapeFromGlobalRanks) {
  const ClusterSpec cluster = parse_cluster_spec("2x4xa100-80");
  const GroupShape node0 = group_shape({0, 1, 2, 3}, cluster);
  EXPECT_EQ(node0.ranks, 4);
  EXPECT_EQ(node0.nodes, 1);
  EXPECT_EQ(node0.ranks_per_node, 4);
  const GroupShape rail = group_shape({1, 5}, cluster);
  EXPECT_EQ(rail.nodes, 2);
  EXPECT_EQ(rail.ranks_per_node, 1);
  const GroupShape uneven = group_shape({0, 1, 4}, cluster);
  EXPECT_EQ(uneven.ranks, 3);
  EXPECT_EQ(uneven.nodes, 2);
  EXPECT_EQ(uneven.ranks_per_node, 2);
  EXPECT_THROW(group_shape({0, 8}, cluster), std::invalid_argument);
  EXPECT_THROW(group_shape({2, 2}, cluster), std::invalid_argument);
  EXPECT_THROW(group_shape({}, cluster), std::invalid_argument);
}

TEST(CostCollective, HierarchicalAcrossNodes) {
  const ClusterSpec c = parse_cluster_spec("4x8xh100");
  const double bytes = 1e9;
  const GroupShape world = GroupShape::across(4, 8);
  // Intra reduce-scatter + per-rail inter all-reduce of B/8 + intra all-gather.
  const double intra = 7 * c.intra.latency + 7.0 / 8 * bytes / c.intra.bandwidth;
  const double inter_ring = 2 * 3 * c.inter.latency + 2 * 3.0 / 4 * (bytes / 8) / c.inter.bandwidth;
  const CollectiveCost ring =
      collective_cost(CollectiveOp::AllReduce, bytes, world, c, Algorithm::Ring);
  EXPECT_TRUE(ring.hierarchical);
  EXPECT_DOUBLE_EQ(ring.time_s, 2 * intra + inter_ring);
  // all_gather of B total: rails gather B/8 across 4 nodes, then the node gathers B.
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::AllGather, bytes, world, c).time_s,
                   3 * c.inter.latency + 3.0 / 4 * (bytes / 8) / c.inter.bandwidth + intra);
  // One GPU per node: only the network stage is left.
  EXPECT_DOUBLE_EQ(
      collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::across(4, 1), c, Algorithm::Ring)
          .time_s,
      ring_all_reduce_time(4, bytes, c.inter));
  // Broadcast: a chain with 4*7 NVLink hops and 3 network hops, bounded by 8 rails of NDR.
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::Broadcast, bytes, world, c).time_s,
                   28 * c.intra.latency + 3 * c.inter.latency + bytes / (8 * c.inter.bandwidth));
  // Point-to-point across nodes uses one NIC.
  EXPECT_DOUBLE_EQ(collective_cost(CollectiveOp::SendRecv, bytes, group_shape({0, 8}, c), c).time_s,
                   c.inter.latency + bytes / c.inter.bandwidth);
  // Crossing nodes costs more than staying inside one.
  EXPECT_GT(collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::across(2, 4), c).time_s,
            collective_cost(CollectiveOp::AllReduce, bytes, GroupShape::within_node(8), c).time_s);
}

// ---------------------------------------------------------------- roofline

TEST(CostRoofline, BigMatmulIsComputeBound) {
  const GpuSpec a100 = gpu_preset("a100-80");
  const ComputeWork work = matmul_work(8192, 8192, 8192, Dtype::BF16);
  EXPECT_DOUBLE_EQ(work.flops, 2.0 * 8192 * 8192 * 8192);
  EXPECT_DOUBLE_EQ(work.bytes, 3.0 * 8192 * 8192 * 2);
  const ComputeCost cost = roofline(work, a100);
  EXPECT_EQ(cost.bound, Bound::Compute);
  EXPECT_DOUBLE_EQ(cost.time_s, work.flops / (0.70 * 312e12));
  EXPECT_GT(cost.compute_s, 10 * cost.memory_s);
}

TEST(CostRoofline, ElementwiseIsMemoryBound) {
  const GpuSpec a100 = gpu_preset("a100-80");
  const ComputeWork add = elementwise_work(1e8, 2, 1, 1, Dtype::FP32); // c = a + b
  EXPECT_DOUBLE_EQ(add.bytes, 1.2e9);
  const ComputeCost cost = roofline(add, a100);
  EXPECT_EQ(cost.bound, Bound::Memory);
  EXPECT_DOUBLE_EQ(cost.time_s, 1.2e9 / 2039e9);
}

TEST(CostRoofline, DtypeSelectsPeakAndOnlyMatmulsUseTensorCores) {
  const GpuSpec h100 = gpu_preset("h100");
  ComputeWork work{1e15, 0, OpClass::Matmul, Dtype::FP32};
  const double fp32 = roofline(work, h100).time_s;
  work.dtype = Dtype::TF32;
  const double tf32 = roofline(work, h100).time_s;
  work.dtype = Dtype::BF16;
  const double bf16 = roofline(work, h100).time_s;
  EXPECT_NEAR(fp32 / bf16, 989.5 / 67, 1e-12);
  EXPECT_NEAR(tf32 / bf16, 1979.0 / 989, 1e-12); // datasheet rounding: not exactly 2
  work.op = OpClass::Elementwise; // CUDA cores: bf16 does not buy the tensor-core peak
  EXPECT_DOUBLE_EQ(roofline(work, h100).time_s, 1e15 / (0.5 * 67e12));
}

TEST(CostRoofline, EfficienciesAreOverridableAndRidgePointSplitsBounds) {
  const GpuSpec a100 = gpu_preset("a100-80");
  Efficiency calibrated;
  calibrated.attention = 0.25;
  const ComputeWork attn{1e13, 0, OpClass::Attention, Dtype::BF16};
  EXPECT_DOUBLE_EQ(roofline(attn, a100, calibrated).time_s, 2 * roofline(attn, a100).time_s);
  calibrated.memory = 0.5;
  const ComputeWork copy = elementwise_work(1e9, 1, 1, 0, Dtype::BF16);
  EXPECT_DOUBLE_EQ(roofline(copy, a100, calibrated).time_s, 2 * roofline(copy, a100).time_s);

  const double ridge = ridge_point(a100, OpClass::Matmul, Dtype::BF16);
  EXPECT_DOUBLE_EQ(ridge, 0.7 * 312e12 / 2039e9); // ~107 FLOP/byte
  const double bytes = 1e9;
  EXPECT_EQ(roofline({1.01 * ridge * bytes, bytes, OpClass::Matmul, Dtype::BF16}, a100).bound,
            Bound::Compute);
  EXPECT_EQ(roofline({0.99 * ridge * bytes, bytes, OpClass::Matmul, Dtype::BF16}, a100).bound,
            Bound::Memory);
  EXPECT_THROW(roofline({-1, 0, OpClass::Matmul, Dtype::BF16}, a100), std::invalid_argument);
}

TEST(CostNames, ParseAcceptsKnownNamesOnly) {
  EXPECT_EQ(parse_dtype("BF16"), Dtype::BF16);
  EXPECT_EQ(parse_op_class("conv"), OpClass::Matmul);
  EXPECT_EQ(parse_collective_op("recv"), CollectiveOp::SendRecv);
  EXPECT_EQ(parse_algorithm("tree"), Algorithm::Tree);
  EXPECT_THROW(parse_dtype("fp8"), std::invalid_argument);
  EXPECT_THROW(parse_collective_op("all_to_all"), std::invalid_argument);
}

} // namespace
} // namespace meshsim
