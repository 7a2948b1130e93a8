// Hardware preset tables (GPUs, links) and the cluster-spec parser.
//
// All FLOP/s are vendor peaks, dense, no sparsity: where a datasheet quotes "with sparsity"
// we halve it. Link bandwidths are derived from lane/link counts by formula so the reader can
// check them; see docs/cost-model.md for the full source list.
#include "cost/hardware.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "base/printable.h"

namespace meshsim {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;

// Datasheets quote tensor-core FLOP/s "with sparsity" (2:4 structured); dense is half.
constexpr double dense(double sparse_flops) {
  return sparse_flops / 2;
}

// A Hopper GH100 (132 SMs) held to a board power between the H100 NVL's 400 W and the H100
// SXM's 700 W: its datasheet peak read off the straight line between the two products'
// datasheet peaks. The clock a power limit allows rises slower than linearly in the power
// (dynamic power grows with frequency times the voltage squared), so the chord is a lower
// bound: at 500 W it gives 89.6 % of the SXM's peaks.
constexpr double kH100NvlWatts = 400, kH100SxmWatts = 700;
constexpr double hopper_at_watts(double watts, double nvl_400w, double sxm_700w) {
  return nvl_400w + (sxm_700w - nvl_400w) * (watts - kH100NvlWatts) / (kH100SxmWatts - kH100NvlWatts);
}

// NVLink 2, 3 and 4 all run 25 GB/s per direction per link; generations differ in link count.
// NVLink 5 (Blackwell) doubles the link: 50 GB/s per direction.
constexpr double kNvlinkPerLinkPerDirection = 25 * kGiga;
constexpr double nvlink(int links) {
  return links * kNvlinkPerLinkPerDirection;
}
constexpr double nvlink5(int links) {
  return 2 * nvlink(links);
}

// PCIe x16, one direction: GT/s per lane x 16 lanes x line-code efficiency / 8 bits.
constexpr int kPcieLanes = 16;
constexpr double kPcie128b130b = 128.0 / 130.0; // PCIe 3.0 and later line code
constexpr double pcie_x16(double gt_per_s) {
  return gt_per_s * kGiga * kPcieLanes * kPcie128b130b / 8;
}

// Network ports are quoted as data rate in Gbit/s.
constexpr double network(double gbit_per_s) {
  return gbit_per_s * kGiga / 8;
}

// What NCCL's bandwidth-bound protocol (Simple) achieves of each kind of link's line rate on
// large messages. Only NVLink's and NVLS's are fitted, each on one calibration row that
// `meshsim validate` lists (docs/cost-model.md); PCIe and network are the share of a packet
// that is payload, from the protocols' own formats: no row is fitted to them.
//  NVLink: nccl-tests #175, all_reduce of 8 A100 SXM over NVSwitch, 232.54 GB/s bus bandwidth
//    at 4 GiB against 12 links x 25 GB/s. Used for every NVLink generation.
//  NVLS: nccl #1455, 8 H100 SXM, NVLS all_reduce 480 GB/s bus bandwidth: algbw = 480 / (2 x 7/8)
//    = 274.3 GB/s against NVLink 4's 450 GB/s.
//  PCIe: 256-byte max payload per TLP with 26 bytes of header, sequence number, LCRC and framing.
//  InfiniBand: 4096-byte MTU with 26 bytes of LRH, BTH, ICRC and VCRC per packet.
//  Ethernet (RoCE v2): 4096-byte MTU with 82 bytes of Ethernet, IP, UDP, BTH, ICRC, preamble and
//    inter-frame gap per packet.
constexpr double kNvlinkEfficiency = 232.54 / 300.0;
constexpr double kNvlsAlgbw = 480.0 / (2.0 * 7 / 8);
constexpr double kNvlsEfficiency = kNvlsAlgbw / 450.0;
constexpr double kPcieEfficiency = 256.0 / (256 + 26);
constexpr double kInfinibandEfficiency = 4096.0 / (4096 + 26);
constexpr double kRoceEfficiency = 4096.0 / (4096 + 82);

// GPU table. Sources (each "dense, no sparsity"):
//  V100 SXM2: NVIDIA Tesla V100 datasheet: FP32 15.7 TF, Tensor (FP16) 125 TF, HBM2 900 GB/s,
//    16/32 GB. Volta has no TF32 and no BF16: those run at the FP32 CUDA-core rate.
//  A100 SXM: NVIDIA A100 datasheet: FP32 19.5 TF, TF32 156 TF, BF16/FP16 312 TF (dense; 312/624
//    with sparsity); 40 GB HBM2 1,555 GB/s, 80 GB HBM2e 2,039 GB/s.
//  H100 SXM: NVIDIA H100 datasheet: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*, FP8 3,958 TF*
//    (*sparsity, halved here), 80 GB HBM3 3.35 TB/s.
//  H200 SXM: NVIDIA H200 datasheet: FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*, FP8 3,958 TF*
//    (the H100 SXM's Hopper compute); 141 GB HBM3e 4.8 TB/s.
//  H100 96 GB (Meta's Grand Teton hosts, torchtitan's benchmarks): 132 SMs with 96 GB of HBM2e
//    at 2.4 TB/s, run at a 500 W power limit (torchtitan
//    benchmarks/llama3_h100_202412_torchtitan.md, docs/async_tp.md). Its peaks are read at 500 W
//    off the line between the H100 datasheet's two 132-SM products (hopper_at_watts): H100 NVL at
//    400 W (FP32 60 TF, TF32 835 TF*, BF16/FP16 1,671 TF*, FP8 3,341 TF*) and H100 SXM at 700 W
//    (above): FP32 62.3, TF32 886.3*, BF16/FP16 1,773.7*, FP8 3,546.7* TF. Memory bandwidth is
//    the HBM's clock, not the SMs': 2.4 TB/s as quoted.
//  H800 SXM: the H100 SXM's compute and 80 GB HBM3 3.35 TB/s, with NVLink cut to 400 GB/s
//    bidirectional (NVIDIA's H800 SXM5 specification; DeepSeek-V3's training cluster).
//  B200 (HGX/DGX B200): NVIDIA DGX B200 datasheet, for 8 GPUs: FP32 600 TF, TF32 18 PF*,
//    BF16/FP16 36 PF*, FP8 72 PF*, 1,440 GB of HBM3e at 64 TB/s; per GPU 75 TF, 1.125 / 2.25 /
//    4.5 PF dense, 180 GB, 8 TB/s.
//  GB200 (a GB200 NVL72 rack's GPU): NVIDIA GB200 NVL72 specifications, for 72 GPUs: FP32
//    5,760 TF, TF32 180 PF*, BF16/FP16 360 PF*, FP8 720 PF*, up to 13.4 TB of HBM3e at 576 TB/s;
//    per GPU 80 TF, 1.25 / 2.5 / 5 PF dense, 186 GB, 8 TB/s.
//  RTX 2080 Ti: NVIDIA Turing architecture whitepaper (reference clocks): FP32 13.4 TF, FP16
//    tensor with FP32 accumulate 53.8 TF, 616 GB/s GDDR6, 11 GB. No TF32/BF16 (FP32 rate).
//  RTX 4090: NVIDIA Ada Lovelace architecture whitepaper: FP32 82.6 TF, TF32 tensor 82.6 TF,
//    BF16/FP16 tensor with FP32 accumulate 165.2 TF, FP8 with FP32 accumulate 330.3 TF (dense),
//    1,008 GB/s GDDR6X, 24 GB.
//  L4: NVIDIA L4 datasheet: FP32 30.3 TF, TF32 120 TF*, BF16/FP16 242 TF*, FP8 485 TF*
//    (*sparsity), 300 GB/s GDDR6, 24 GB.
//  FP8 is 0 on Volta, Turing and Ampere: they have no FP8 tensor cores.
// Memory capacity is decimal GB as the vendors quote it (80 GB = 80e9 bytes).
// Units as the datasheets print them: TFLOP/s, GB/s, GB.
GpuSpec gpu(const char* name, GpuArch arch, double fp32_tf, double tf32_tf, double bf16_tf,
            double fp16_tf, double fp8_tf, double mem_gb_per_s, double mem_gb) {
  return {name,
          arch,
          fp32_tf * kTera,
          tf32_tf * kTera,
          bf16_tf * kTera,
          fp16_tf * kTera,
          fp8_tf * kTera,
          mem_gb_per_s * kGiga,
          mem_gb * kGiga};
}

constexpr GpuArch kVolta = GpuArch::Volta, kTuring = GpuArch::Turing, kAmpere = GpuArch::Ampere,
                  kAda = GpuArch::Ada, kHopper = GpuArch::Hopper, kBlackwell = GpuArch::Blackwell;

// clang-format off
const std::vector<GpuSpec> kGpus = {
    //   name       arch        fp32  tf32         bf16         fp16         fp8          mem GB/s  GB
    gpu("v100-16", kVolta,     15.7, 15.7,        15.7,        125,         0,           900,      16),
    gpu("v100-32", kVolta,     15.7, 15.7,        15.7,        125,         0,           900,      32),
    gpu("a100-40", kAmpere,    19.5, 156,         312,         312,         0,           1555,     40),
    gpu("a100-80", kAmpere,    19.5, 156,         312,         312,         0,           2039,     80),
    gpu("h100",    kHopper,    67,   dense(989),  dense(1979), dense(1979), dense(3958), 3350,     80),
    gpu("h200",    kHopper,    67,   dense(989),  dense(1979), dense(1979), dense(3958), 4800,     141),
    gpu("h100-96", kHopper,    hopper_at_watts(500, 60, 67), dense(hopper_at_watts(500, 835, 989)),
                               dense(hopper_at_watts(500, 1671, 1979)), dense(hopper_at_watts(500, 1671, 1979)),
                               dense(hopper_at_watts(500, 3341, 3958)),                   2400,     96),
    gpu("h800",    kHopper,    67,   dense(989),  dense(1979), dense(1979), dense(3958), 3350,     80),
    gpu("b200",    kBlackwell, 75,   dense(2250), dense(4500), dense(4500), dense(9000), 8000,     180),
    gpu("gb200",   kBlackwell, 80,   dense(2500), dense(5000), dense(5000), dense(10000), 8000,    13400.0 / 72),
    gpu("2080ti",  kTuring,    13.4, 13.4,        13.4,        53.8,        0,           616,      11),
    gpu("4090",    kAda,       82.6, 82.6,        165.2,       165.2,       330.3,       1008,     24),
    gpu("l4",      kAda,       30.3, dense(120),  dense(242),  dense(242),  dense(485),  300,      24),
};
// clang-format on

// Link table: line rate per GPU (network: per NIC) per direction.
//  nvlink2: V100 SXM2, 6 links (datasheet "300 GB/s" counts both directions).
//  nvlink3: A100 SXM, 12 links (datasheet "600 GB/s" bidirectional).
//  nvlink4: H100/H200 SXM, 18 links (datasheet "900 GB/s" bidirectional); HGX H100/H200's
//    third-generation NVSwitch reduces in the switch (NVLink SHARP, NCCL's NVLS).
//  nvlink4-h800: H800 SXM, 8 NVLink 4 links (specification "400 GB/s" bidirectional), behind
//    the same third-generation NVSwitch.
//  nvlink5: B200 and GB200, 18 NVLink 5 links (datasheets "1.8 TB/s" bidirectional per GPU),
//    behind fourth-generation NVLink switches that reduce (NVLS) as the third did; in a GB200
//    NVL72 all 72 GPUs of the rack are one NVLink domain (a node of 72: "8x72xgb200").
//  NVLink numbers assume an NVSwitch (DGX/HGX) so every GPU reaches its peers at full rate.
//  pcie3/4/5: 8/16/32 GT/s per lane, x16, 128b/130b (PCI-SIG base specifications).
//  edr/hdr/ndr: InfiniBand EDR 100 Gb/s, HDR 200 Gb/s and NDR 400 Gb/s per port (NVIDIA
//    ConnectX-5/-6/-7; DGX-1 V100 ships four EDR ports).
//  100gbe: 100 Gb/s Ethernet (RoCE assumed; with TCP sockets the latency is ~10x higher).
// clang-format off
const std::vector<LinkSpec> kLinks = {
    {"nvlink2", nvlink(6),    kNvlinkEfficiency,     LinkKind::NVLink,  0},
    {"nvlink3", nvlink(12),   kNvlinkEfficiency,     LinkKind::NVLink,  0},
    {"nvlink4", nvlink(18),   kNvlinkEfficiency,     LinkKind::NVLink,  kNvlsEfficiency},
    {"nvlink4-h800", nvlink(8), kNvlinkEfficiency,   LinkKind::NVLink,  kNvlsEfficiency},
    {"nvlink5", nvlink5(18),  kNvlinkEfficiency,     LinkKind::NVLink,  kNvlsEfficiency},
    {"pcie3",   pcie_x16(8),  kPcieEfficiency,       LinkKind::PCIe,    0},
    {"pcie4",   pcie_x16(16), kPcieEfficiency,       LinkKind::PCIe,    0},
    {"pcie5",   pcie_x16(32), kPcieEfficiency,       LinkKind::PCIe,    0},
    {"edr",     network(100), kInfinibandEfficiency, LinkKind::Network, 0},
    {"hdr",     network(200), kInfinibandEfficiency, LinkKind::Network, 0},
    {"ndr",     network(400), kInfinibandEfficiency, LinkKind::Network, 0},
    {"100gbe",  network(100), kRoceEfficiency,       LinkKind::Network, 0},
};
// clang-format on

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

template <typename T> std::string known_names(const std::vector<T>& table) {
  std::string names;
  for (const T& entry : table)
    names += (names.empty() ? "" : ", ") + entry.name;
  return names;
}

template <typename T>
const T& find_by_name(const std::vector<T>& table, const std::string& name, const char* what) {
  const std::string key = lower(name);
  for (const T& entry : table)
    if (entry.name == key)
      return entry;
  throw std::invalid_argument("unknown " + std::string(what) + " \"" + printable(name) +
                              "\" (known: " + known_names(table) + ")");
}

// A count of nodes or GPUs: the largest clusters built have tens of thousands of GPUs.
constexpr int kMaxCount = 100000;

// A positive decimal count, with a one-line error naming the whole spec and the value.
// `source` names the flag and its value as given ("invalid cluster spec \"4x8xh100\"",
// "--inter \"0xndr\""): the message blames what the user typed.
int parse_count(const std::string& text, const std::string& source, const char* what,
                const char* form = "NODESxGPUSxMODEL, e.g. 4x8xh100") {
  const bool digits =
      !text.empty() &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
  const std::string head = source + ": " + what + " " + printable(text);
  if (!digits)
    throw std::invalid_argument(head + " is not a positive integer (expected " + form + ")");
  // Compare as text first: no overflow whatever the length.
  const std::string trimmed = text.substr(std::min(text.find_first_not_of('0'), text.size()));
  if (trimmed.empty()) throw std::invalid_argument(head + " must be at least 1");
  if (trimmed.size() > 6 || std::stoi(trimmed) > kMaxCount)
    throw std::invalid_argument(head + " is more than " + std::to_string(kMaxCount));
  return std::stoi(trimmed);
}

// Bare GPU names and the preset each stands for: the larger-memory board, as cloud
// instances of these GPUs mostly are (p4de/ND A100 v4 80 GB, p3dn V100 32 GB).
const std::vector<std::pair<std::string, std::string>> kBareGpuNames = {
    {"a100", "a100-80"}, {"v100", "v100-32"}};

} // namespace

Dtype parse_dtype(const std::string& name) {
  const std::string key = lower(name);
  if (key == "fp32" || key == "float32")
    return Dtype::FP32;
  if (key == "tf32")
    return Dtype::TF32;
  if (key == "bf16" || key == "bfloat16")
    return Dtype::BF16;
  if (key == "fp16" || key == "float16" || key == "half")
    return Dtype::FP16;
  if (key == "fp8")
    return Dtype::FP8;
  throw std::invalid_argument("unknown dtype \"" + printable(name) +
                              "\" (known: fp32, tf32, bf16, fp16, fp8)");
}

const char* to_string(Dtype dtype) {
  switch (dtype) {
  case Dtype::FP32:
    return "fp32";
  case Dtype::TF32:
    return "tf32";
  case Dtype::BF16:
    return "bf16";
  case Dtype::FP16:
    return "fp16";
  case Dtype::FP8:
    return "fp8";
  }
  return "?";
}

const char* to_string(GpuArch arch) {
  switch (arch) {
  case GpuArch::Volta:
    return "Volta";
  case GpuArch::Turing:
    return "Turing";
  case GpuArch::Ampere:
    return "Ampere";
  case GpuArch::Ada:
    return "Ada";
  case GpuArch::Hopper:
    return "Hopper";
  case GpuArch::Blackwell:
    return "Blackwell";
  }
  return "?";
}

double dtype_bytes(Dtype dtype) {
  if (dtype == Dtype::FP8)
    return 1.0;
  return (dtype == Dtype::BF16 || dtype == Dtype::FP16) ? 2.0 : 4.0;
}

double GpuSpec::peak_flops(Dtype dtype) const {
  switch (dtype) {
  case Dtype::FP32:
    return fp32_flops;
  case Dtype::TF32:
    return tf32_flops;
  case Dtype::BF16:
    return bf16_flops;
  case Dtype::FP16:
    return fp16_flops;
  case Dtype::FP8:
    return fp8_flops;
  }
  return fp32_flops;
}

const std::vector<GpuSpec>& gpu_presets() {
  return kGpus;
}
const std::vector<LinkSpec>& link_presets() {
  return kLinks;
}

GpuSpec gpu_preset(const std::string& name) {
  return find_by_name(kGpus, name, "GPU model");
}
LinkSpec link_preset(const std::string& name) {
  return find_by_name(kLinks, name, "link");
}

// Each generation's SXM boards sit behind its NVSwitch (the H800's with NVLink cut down);
// Turing and Ada boards have no NVSwitch.
std::string default_intra_link(const std::string& gpu_name) {
  const GpuSpec gpu = gpu_preset(gpu_name); // validates the name
  switch (gpu.arch) {
  case GpuArch::Hopper:
    return gpu.name == "h800" ? "nvlink4-h800" : "nvlink4";
  case GpuArch::Blackwell:
    return "nvlink5";
  case GpuArch::Ampere:
    return "nvlink3";
  case GpuArch::Volta:
    return "nvlink2";
  case GpuArch::Turing:
    return "pcie3"; // consumer boards; NVLink bridges pair only 2 GPUs
  case GpuArch::Ada:
    return "pcie4"; // 4090 and L4 have no NVLink
  }
  return "pcie4";
}

std::string default_inter_link(const std::string& gpu_name) {
  const GpuArch arch = gpu_preset(gpu_name).arch;
  // DGX H100 and DGX B200 ship NDR (ConnectX-7, 400 Gb/s), DGX A100 HDR; DeepSeek-V3's H800
  // nodes have 400 Gb/s InfiniBand NICs, and so does a GB200 NVL72's compute tray.
  return arch == GpuArch::Hopper || arch == GpuArch::Blackwell ? "ndr" : "hdr";
}

double ClusterSpec::inter_per_gpu() const {
  return inter.achieved() * std::min(1.0, static_cast<double>(nics()) / gpus_per_node);
}

std::string ClusterSpec::to_string() const {
  const std::string nic_count =
      nics_per_node > 0 ? std::to_string(nics_per_node) + "x" : std::string();
  return std::to_string(nodes) + "x" + std::to_string(gpus_per_node) + "x" + gpu.name + " (intra " +
         intra.name + ", inter " + nic_count + inter.name + ")";
}

ClusterSpec parse_cluster_spec(const std::string& spec, const std::string& intra_override,
                               const std::string& inter_override) {
  // Split on 'x' but only before the model name: model names never start with a digit run
  // followed by 'x', so at most the first two 'x'-separated parts are counts.
  std::vector<std::string> parts;
  const size_t first = spec.find_first_not_of(" \t");
  std::string rest = first == std::string::npos
                         ? std::string()
                         : lower(spec.substr(first, spec.find_last_not_of(" \t") - first + 1));
  for (int i = 0; i < 2; ++i) {
    const size_t x = rest.find('x');
    if (x == std::string::npos || x == 0 ||
        !std::all_of(rest.begin(), rest.begin() + static_cast<long>(x),
                     [](unsigned char c) { return std::isdigit(c); }))
      break;
    parts.push_back(rest.substr(0, x));
    rest = rest.substr(x + 1);
  }
  if (rest.empty())
    throw std::invalid_argument("invalid cluster spec \"" + printable(spec) +
                                "\": missing GPU model (expected NODESxGPUSxMODEL, e.g. 4x8xh100)");

  ClusterSpec cluster;
  const std::string source = "invalid cluster spec \"" + printable(spec) + "\"";
  if (parts.size() == 2) {
    cluster.nodes = parse_count(parts[0], source, "node count");
    cluster.gpus_per_node = parse_count(parts[1], source, "GPUs per node");
  } else if (parts.size() == 1) {
    cluster.gpus_per_node = parse_count(parts[0], source, "GPUs per node");
  }
  if (static_cast<int64_t>(cluster.nodes) * cluster.gpus_per_node > kMaxCount)
    throw std::invalid_argument("invalid cluster spec \"" + printable(spec) + "\": " +
                                std::to_string(static_cast<int64_t>(cluster.nodes) *
                                               cluster.gpus_per_node) +
                                " GPUs in all is more than " + std::to_string(kMaxCount));
  for (const auto& [bare, preset] : kBareGpuNames)
    if (rest == bare) {
      cluster.note = bare + " taken as " + preset + ", the default for the bare name (name " +
                     bare + "-... for another board)";
      rest = preset;
    }
  // "--inter 4xhdr": NICs per node, then the link.
  std::string inter = lower(inter_override);
  if (const size_t x = inter.find('x');
      x != std::string::npos && x > 0 && std::isdigit(static_cast<unsigned char>(inter[0]))) {
    cluster.nics_per_node =
        parse_count(inter.substr(0, x), "--inter \"" + printable(inter_override) + "\"",
                    "NICs per node", "NICSxLINK, e.g. 4xhdr");
    inter = inter.substr(x + 1);
  }
  // Each name is blamed on the flag that gave it.
  const auto blamed = [](const std::string& flag, const std::string& value, auto&& parse) {
    try {
      return parse();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(flag + " \"" + printable(value) + "\": " + e.what());
    }
  };
  cluster.gpu = blamed("invalid cluster spec", spec, [&] { return gpu_preset(rest); });
  cluster.intra = intra_override.empty()
                      ? link_preset(default_intra_link(rest))
                      : blamed("--intra", intra_override, [&] { return link_preset(intra_override); });
  cluster.inter = inter.empty() ? link_preset(default_inter_link(rest))
                                : blamed("--inter", inter_override, [&] { return link_preset(inter); });
  return cluster;
}

} // namespace meshsim
