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
  // H800: the H100's compute and memory; its NVLink is cut (nvlink4-h800, 8 of 18 links).
  EXPECT_DOUBLE_EQ(gpu_preset("h800").peak_flops(Dtype::BF16), 989.5e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h800").mem_bytes, 80e9);
  EXPECT_EQ(default_intra_link("h800"), "nvlink4-h800");
  // Blackwell: the DGX B200 and GB200 NVL72 datasheets' 8- and 72-GPU figures, per GPU, dense.
  EXPECT_DOUBLE_EQ(gpu_preset("b200").peak_flops(Dtype::BF16), 2250e12);
  EXPECT_DOUBLE_EQ(gpu_preset("b200").mem_bytes, 180e9);
  EXPECT_DOUBLE_EQ(gpu_preset("gb200").peak_flops(Dtype::BF16), 2500e12);
  EXPECT_DOUBLE_EQ(gpu_preset("gb200").mem_bw, 8e12);
  EXPECT_EQ(default_intra_link("gb200"), "nvlink5");
  EXPECT_EQ(gpu_presets().size(), 13u); // h100-96 since FP8 (test_fp8.cpp)
  for (const GpuSpec& gpu : gpu_presets()) {
    EXPECT_GE(gpu.peak_flops(Dtype::BF16), gpu.fp32_flops) << gpu.name;
    EXPECT_GT(gpu.mem_bw, 0) << gpu.name;
  }
}

TEST(CostHardware, LinkBandwidthIsPerGpuPerDirection) {
  EXPECT_DOUBLE_EQ(link_preset("nvlink2").bandwidth, 150e9); // "300 GB/s" bidirectional
  EXPECT_DOUBLE_EQ(link_preset("nvlink3").bandwidth, 300e9); // "600 GB/s"
  EXPECT_DOUBLE_EQ(link_preset("nvlink4").bandwidth, 450e9); // "900 GB/s"
  EXPECT_DOUBLE_EQ(link_preset("nvlink4-h800").bandwidth, 200e9); // "400 GB/s"
  EXPECT_DOUBLE_EQ(link_preset("nvlink5").bandwidth, 900e9);      // "1.8 TB/s"
  EXPECT_DOUBLE_EQ(link_preset("pcie3").bandwidth, 8e9 * 16 * 128 / 130 / 8);
  EXPECT_DOUBLE_EQ(link_preset("pcie4").bandwidth, 2 * link_preset("pcie3").bandwidth);
  EXPECT_DOUBLE_EQ(link_preset("pcie5").bandwidth, 2 * link_preset("pcie4").bandwidth);
  EXPECT_DOUBLE_EQ(link_preset("hdr").bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(link_preset("ndr").bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(link_preset("100gbe").bandwidth, 12.5e9);
  // What each achieves of its line rate: NVLink fitted on one nccl-tests row, PCIe and
  // networks the payload share of their packets.
  EXPECT_DOUBLE_EQ(link_preset("nvlink3").achieved(), 232.54e9);
  EXPECT_DOUBLE_EQ(link_preset("pcie4").efficiency, 256.0 / 282);
  EXPECT_DOUBLE_EQ(link_preset("hdr").efficiency, 4096.0 / 4122);
  EXPECT_GT(link_preset("nvlink4").nvls_efficiency, 0);
  EXPECT_EQ(link_preset("nvlink3").nvls_efficiency, 0);
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
  // A GB200 NVL72 rack is one NVLink domain of 72 GPUs: a node of 72.
  const ClusterSpec racks = parse_cluster_spec("8x72xgb200");
  EXPECT_EQ(racks.world_size(), 576);
  EXPECT_EQ(racks.intra.name, "nvlink5");
  EXPECT_EQ(racks.node_of(71), 0);
  EXPECT_EQ(racks.node_of(72), 1);
  // DeepSeek-V3's cluster: H800 nodes, 8 NDR NICs each.
  const ClusterSpec h800 = parse_cluster_spec("256x8xh800", "", "8xndr");
  EXPECT_EQ(h800.intra.name, "nvlink4-h800");
  EXPECT_EQ(h800.nics_per_node, 8);
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
      {"4x8xb300", "", "unknown GPU model \"b300\""},
      {"4xaxh100", "", "unknown GPU model"},
      {"9999999x8xh100", "", "node count 9999999 is more than"},
      {"8xa100-80", "nvlink9", "unknown link \"nvlink9\""},
  };
  // --inter's NIC count and link are blamed on --inter, not on the cluster spec.
  for (const auto& [inter, expect] : {std::pair<std::string, std::string>{"0xndr", "NICs per node 0 must be at least 1"},
                                      {"4xndx", "unknown link \"ndx\""}}) {
    try {
      parse_cluster_spec("8xh100", "", inter);
      ADD_FAILURE() << "no error for --inter " << inter;
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("--inter \"" + inter + "\": ", 0), 0u) << message;
      EXPECT_NE(message.find(expect), std::string::npos) << message;
    }
  }
  for (const auto& c : cases) {
    try {
      parse_cluster_spec(c.spec, c.intra);
      ADD_FAILURE() << "no error for \"" << c.spec << "\"";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c.expect), std::string::npos) << message;
      // The message blames the flag whose value is wrong.
      const std::string blamed = *c.intra ? "--intra \"" + std::string(c.intra) + "\""
                                          : "invalid cluster spec \"" + std::string(c.spec) + "\"";
      EXPECT_NE(message.find(blamed), std::string::npos) << message;
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

TEST(CostCollective, BusBandwidthFollowsNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::AllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::ReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::SendRecv, 2), 1.0);
  const Bandwidths bw = bandwidths(CollectiveOp::AllReduce, 4, 1e9, 0.01);
  EXPECT_DOUBLE_EQ(bw.algbw, 1e11);
  EXPECT_DOUBLE_EQ(bw.busbw, 1e11 * 1.5);

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

// ---------------------------------------------------------------- roofline

TEST(CostRoofline, BigMatmulIsComputeBound) {
  const GpuSpec a100 = gpu_preset("a100-80");
  const ComputeWork work = matmul_work(8192, 8192, 8192, Dtype::BF16);
  EXPECT_DOUBLE_EQ(work.flops, 2.0 * 8192 * 8192 * 8192);
  EXPECT_DOUBLE_EQ(work.bytes, 3.0 * 8192 * 8192 * 2);
  const ComputeCost cost = roofline(work, a100);
  EXPECT_EQ(cost.bound, Bound::Compute);
  EXPECT_DOUBLE_EQ(cost.time_s, work.flops / (Efficiency{}.matmul * 312e12));
  EXPECT_GT(cost.compute_s, 10 * cost.memory_s);
}

TEST(CostRoofline, ElementwiseIsMemoryBound) {
  const GpuSpec a100 = gpu_preset("a100-80");
  const ComputeWork add = elementwise_work(1e8, 2, 1, 1, Dtype::FP32); // c = a + b
  EXPECT_DOUBLE_EQ(add.bytes, 1.2e9);
  const ComputeCost cost = roofline(add, a100);
  EXPECT_EQ(cost.bound, Bound::Memory);
  EXPECT_DOUBLE_EQ(cost.time_s, 1.2e9 / (Efficiency{}.memory * 2039e9));
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
  EXPECT_DOUBLE_EQ(roofline(copy, a100, calibrated).time_s,
                   Efficiency{}.memory / 0.5 * roofline(copy, a100).time_s);

  const double ridge = ridge_point(a100, OpClass::Matmul, Dtype::BF16);
  EXPECT_DOUBLE_EQ(ridge, Efficiency{}.matmul * 312e12 / (Efficiency{}.memory * 2039e9));
  const double bytes = 1e9;
  EXPECT_EQ(roofline({1.01 * ridge * bytes, bytes, OpClass::Matmul, Dtype::BF16}, a100).bound,
            Bound::Compute);
  EXPECT_EQ(roofline({0.99 * ridge * bytes, bytes, OpClass::Matmul, Dtype::BF16}, a100).bound,
            Bound::Memory);
  EXPECT_THROW(roofline({-1, 0, OpClass::Matmul, Dtype::BF16}, a100), std::invalid_argument);
}

TEST(CostRoofline, SmallGemmsReachLessOfThePeakAndEveryKernelCostsALaunch) {
  const GpuSpec a100 = gpu_preset("a100-80");
  const Efficiency eff;
  const double peak = 312e12;
  // A GEMM whose time at peak equals gemm_half_s reaches half of the large-GEMM efficiency.
  EXPECT_DOUBLE_EQ(gemm_efficiency(eff.gemm_half_s * peak, peak, eff), eff.matmul / 2);
  EXPECT_NEAR(gemm_efficiency(1e6 * eff.gemm_half_s * peak, peak, eff), eff.matmul, 1e-6);
  EXPECT_LT(gemm_efficiency(1e9, peak, eff), gemm_efficiency(1e12, peak, eff));
  // Two GEMMs of 1 TFLOP: each at its own size's efficiency; the memory-bound rest on top.
  KernelMix mix;
  mix.gemm_flops = 2e12;
  mix.gemms = 2;
  mix.other_bytes = 1e9;
  mix.kernels = 5;
  const double gemm_eff = gemm_efficiency(1e12, peak, eff);
  EXPECT_DOUBLE_EQ(kernel_mix_time(mix, a100, eff),
                   2e12 / (gemm_eff * peak) + 1e9 / (eff.memory * 2039e9));
  // Tiny kernels: the launches are the floor.
  KernelMix tiny;
  tiny.gemm_flops = 1e3;
  tiny.gemms = 1;
  tiny.kernels = 40;
  EXPECT_DOUBLE_EQ(kernel_mix_time(tiny, a100, eff), 40 * eff.launch_s);
}

TEST(CostNames, ParseAcceptsKnownNamesOnly) {
  EXPECT_EQ(parse_dtype("BF16"), Dtype::BF16);
  EXPECT_EQ(parse_op_class("conv"), OpClass::Matmul);
  EXPECT_EQ(parse_collective_op("recv"), CollectiveOp::SendRecv);
  EXPECT_EQ(parse_algorithm("tree"), Algorithm::Tree);
  EXPECT_EQ(parse_dtype("fp8"), Dtype::FP8);
  EXPECT_THROW(parse_dtype("fp4"), std::invalid_argument);
  EXPECT_THROW(parse_collective_op("scatter"), std::invalid_argument);
}

} // namespace
} // namespace meshsim
