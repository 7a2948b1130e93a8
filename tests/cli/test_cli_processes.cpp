// A run made of processes (--backend c10d, started by meshsim launch) is the same run as on
// virtual GPUs: the same loss every step, the same final parameters (within 1e-6 relative:
// Gloo sums in another order than the in-process backend), and every GPU the same peak
// parameter, gradient and optimizer bytes. Also across two "nodes": two launches, each in a
// network namespace of its own joined by a veth pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../python_torch.h"
#include "mesh/rank_runner.h"
#include "process_harness.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

namespace {

// Relative agreement required of losses and parameters: the bound. Float32 sums in
// another order differ by a few units of 6e-8 per step; these runs are 4 steps long.
constexpr double kProcessTolerance = 1e-6;

void expect_same_losses(const fs::path& processes, const fs::path& threads, const std::string& what) {
  const auto a = run_losses(processes), b = run_losses(threads);
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_NEAR(a[k], b[k], kProcessTolerance * std::abs(b[k])) << what << " step " << k + 1;
    worst = std::max(worst, std::abs(a[k] - b[k]) / std::abs(b[k]));
  }
  std::printf("%-10s losses of %zu steps within %.2g relative\n", what.c_str(), a.size(), worst);
}

void expect_same_model_state_peaks(const fs::path& processes, const fs::path& threads,
                                   const std::string& what) {
  const auto a = read_json(processes / "summary.json")["gpus"];
  const auto b = read_json(threads / "summary.json")["gpus"];
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t r = 0; r < a.size(); ++r)
    for (const char* category : {"parameters", "gradients", "optimizer"})
      EXPECT_EQ(a[r]["peak_by_category"][category], b[r]["peak_by_category"][category])
          << what << " gpu" << r << " " << category;
}

fs::path exported(const fs::path& run) {
  const fs::path file = run / "exported.pt";
  const auto r = run_meshsim_exactly("export " + run.string() + " --state-dict " + file.string());
  EXPECT_EQ(r.code, 0) << r.output;
  return file;
}

// The layout trained on 4 processes and on 4 virtual GPUs: losses, peaks and parameters.
void expect_processes_match_threads(const std::string& name, const std::string& layout) {
  if (!meshsim::c10d_available())
    GTEST_SKIP() << "this build has no c10d backend (its LibTorch has no Gloo headers)";
  const fs::path processes = fresh_dir("c10d-" + name), threads = fresh_dir("sim-" + name);
  const std::string train = kProcessGpt + "--gpus 4 --max-steps 4 " + layout;
  const auto p = launch_c10d(4, train + " --out " + processes.string());
  ASSERT_EQ(p.code, 0) << p.output;
  const auto t = run_meshsim(train + " --out " + threads.string());
  ASSERT_EQ(t.code, 0) << t.output;
  // Either way the host's cores are shared among its 4 ranks, and the first line says so.
  const std::string share = fmt::format(", {} threads per rank)", meshsim::threads_per_rank(4));
  EXPECT_NE(p.output.find(share), std::string::npos) << share << "\n" << p.output;
  EXPECT_NE(t.output.find(share), std::string::npos) << share << "\n" << t.output;
  expect_same_losses(processes, threads, name);
  expect_same_model_state_peaks(processes, threads, name);
  EXPECT_EQ(read_json(processes / "summary.json")["backend"], "c10d");
  // The merged run folder keeps the contract: one memory.csv column and trace process per GPU.
  const auto trace = read_json(processes / "trace.json");
  EXPECT_EQ(trace["otherData"]["num_gpus"], 4) << name;
  EXPECT_NE(read_text(processes / "memory.csv").find("gpu3_mib"), std::string::npos) << name;
  if (!python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch() << ": final parameters not compared";
  const auto worst = state_dict_differences({{exported(processes), exported(threads)}});
  ASSERT_EQ(worst.size(), 1u) << name;
  EXPECT_LT(worst[0], kProcessTolerance) << name << ": final parameters differ";
  std::printf("%-10s final parameters within %.2g relative\n", name.c_str(), worst[0]);
}

} // namespace

TEST(CliProcesses, DdpMatchesVirtualGpus) { expect_processes_match_threads("ddp", "--strategy ddp"); }
TEST(CliProcesses, Zero1MatchesVirtualGpus) { expect_processes_match_threads("zero1", "--zero 1"); }
TEST(CliProcesses, Zero2MatchesVirtualGpus) { expect_processes_match_threads("zero2", "--zero 2"); }
TEST(CliProcesses, Zero3MatchesVirtualGpus) { expect_processes_match_threads("zero3", "--zero 3"); }
TEST(CliProcesses, Tp2MatchesVirtualGpus) { expect_processes_match_threads("tp2", "--tp 2 --pp 1"); }
TEST(CliProcesses, Pp2OneFOneBMatchesVirtualGpus) {
  expect_processes_match_threads("pp2", "--pp 2 --schedule 1f1b --micro-batches 2");
}
TEST(CliProcesses, Dp2Tp2MatchesVirtualGpus) { expect_processes_match_threads("dp2tp2", "--tp 2"); }

namespace {

// Two launches of 2 processes each, node 0 serving the rendezvous at `addr`; `wrap0` and
// `wrap1` prefix each launch (to run it in a network namespace). Both must end 0.
void two_nodes(const fs::path& out, const std::string& addr, const std::string& wrap0,
               const std::string& wrap1) {
  const int port = free_port();
  const std::string train = kProcessGpt +
                            "--gpus 4 --max-steps 4 --strategy ddp --backend c10d --no-progress "
                            "--out " + out.string();
  auto command = [&](int node, const std::string& wrap) {
    return fmt::format("{} {} launch --nproc-per-node 2 --nnodes 2 --node-rank {} --master-addr "
                       "{} --master-port {} -- {} > {}/node{}.log 2>&1",
                       wrap, MESHSIM_BINARY, node, addr, port, train, out.parent_path().string(),
                       node);
  };
  fs::create_directories(out.parent_path());
  // Node 1 in the background, node 0 here; then node 1's status.
  const std::string both = "( " + command(1, wrap1) + " ; echo $? > " +
                           (out.parent_path() / "node1.rc").string() + " ) & " +
                           command(0, wrap0) + "; rc=$?; wait; exit $rc";
  const int status = std::system(("bash -c '" + both + "'").c_str());
  const auto log0 = read_text(out.parent_path() / "node0.log");
  const auto log1 = read_text(out.parent_path() / "node1.log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log0 << "\n---\n" << log1;
  EXPECT_EQ(read_text(out.parent_path() / "node1.rc"), "0\n") << log1;
}

// A network namespace with one end of a veth pair, removed when the test ends.
class NetworkNamespaces {
public:
  NetworkNamespaces() : tag_(std::to_string(::getpid() % 100000)) {
    const std::string a = "msa" + tag_, b = "msb" + tag_;
    const std::string setup =
        "ip netns add " + a + " && ip netns add " + b + " && ip link add va" + tag_ +
        " type veth peer name vb" + tag_ + " && ip link set va" + tag_ + " netns " + a +
        " && ip link set vb" + tag_ + " netns " + b + " && ip -n " + a +
        " addr add 10.77.0.1/24 dev va" + tag_ + " && ip -n " + b +
        " addr add 10.77.0.2/24 dev vb" + tag_ + " && ip -n " + a + " link set va" + tag_ +
        " up && ip -n " + b + " link set vb" + tag_ + " up && ip -n " + a +
        " link set lo up && ip -n " + b + " link set lo up";
    made_ = std::system(("(" + setup + ") > /tmp/meshsim-netns-" + tag_ + ".log 2>&1").c_str()) == 0;
    why_ = read_text("/tmp/meshsim-netns-" + tag_ + ".log");
    if (!made_)
      remove();
  }
  ~NetworkNamespaces() { remove(); }
  bool made() const { return made_; }
  const std::string& why() const { return why_; }
  std::string exec(int node) const { return "ip netns exec ms" + std::string(node ? "b" : "a") + tag_; }

private:
  void remove() {
    std::system(("ip netns del msa" + tag_ + " >/dev/null 2>&1; ip netns del msb" + tag_ +
                 " >/dev/null 2>&1; rm -f /tmp/meshsim-netns-" + tag_ + ".log")
                    .c_str());
  }
  std::string tag_;
  bool made_ = false;
  std::string why_;
};

} // namespace

TEST(CliProcesses, TwoNodesInTheirOwnNetworkNamespacesMatchOneNode) {
  if (!meshsim::c10d_available())
    GTEST_SKIP() << "this build has no c10d backend (its LibTorch has no Gloo headers)";
  NetworkNamespaces namespaces;
  if (!namespaces.made())
    GTEST_SKIP() << "cannot make network namespaces here (needs CAP_NET_ADMIN): "
                 << namespaces.why()
                 << "; CliProcesses.TwoLaunchesOnLoopbackMatchOneLaunch runs instead";
  const fs::path base = fresh_dir("two-nodes-netns");
  const fs::path two = base / "run", one = fresh_dir("one-node-netns");
  two_nodes(two, "10.77.0.1", namespaces.exec(0), namespaces.exec(1));
  const auto r = launch_c10d(4, kProcessGpt + "--gpus 4 --max-steps 4 --strategy ddp --out " +
                                    one.string());
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_losses(two, one, "two nodes");
  expect_same_model_state_peaks(two, one, "two nodes");
}

TEST(CliProcesses, TwoLaunchesOnLoopbackMatchOneLaunch) {
  if (!meshsim::c10d_available())
    GTEST_SKIP() << "this build has no c10d backend (its LibTorch has no Gloo headers)";
  const fs::path base = fresh_dir("two-nodes-loopback");
  const fs::path two = base / "run", one = fresh_dir("one-node-loopback");
  two_nodes(two, "127.0.0.1", "", "");
  const auto r = launch_c10d(4, kProcessGpt + "--gpus 4 --max-steps 4 --strategy ddp --out " +
                                    one.string());
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_losses(two, one, "two launches");
  expect_same_model_state_peaks(two, one, "two launches");
}

// A mixture of experts over ep 2 in 2 processes: rank 0 writes routing.csv and summary.json's
// "routing" from every rank's part, as a run on virtual GPUs writes them. The first step routes
// the same weights and tokens, so its rows are the threads' to the byte; later steps route
// weights whose gradients Gloo summed in another order, so only their shape is compared.
TEST(CliProcesses, ExpertParallelWritesEveryRanksRouting) {
  if (!meshsim::c10d_available())
    GTEST_SKIP() << "this build has no c10d backend (its LibTorch has no Gloo headers)";
  const fs::path processes = fresh_dir("c10d-ep"), threads = fresh_dir("sim-ep");
  const std::string train =
      "train --model llama --layers 2 --hidden 32 --heads 4 --seq-len 16 --vocab 64 "
      "--data synthetic --synthetic-train 256 --synthetic-test 32 --batch-size 4 "
      "--moe-experts 4 --moe-top-k 2 --gpus 2 --ep 2 --max-steps 3 ";
  const auto p = launch_c10d(2, train + "--out " + processes.string());
  ASSERT_EQ(p.code, 0) << p.output;
  const auto t = run_meshsim(train + "--out " + threads.string());
  ASSERT_EQ(t.code, 0) << t.output;
  const auto lines = [](const fs::path& run) {
    std::vector<std::string> out;
    std::istringstream in(read_text(run / "routing.csv"));
    for (std::string line; std::getline(in, line);)
      out.push_back(line);
    return out;
  };
  const std::vector<std::string> a = lines(processes), b = lines(threads);
  // A header, then 3 steps × 2 ranks × 2 layers × 4 experts.
  ASSERT_EQ(a.size(), 1u + 3 * 2 * 2 * 4);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (i == 0 || a[i].rfind("1,", 0) == 0) {
      EXPECT_EQ(a[i], b[i]) << "row " << i;
    }
  const auto routing = read_json(processes / "summary.json")["routing"];
  const auto expected = read_json(threads / "summary.json")["routing"];
  ASSERT_TRUE(routing.is_object());
  for (const char* key : {"experts", "layers", "steps"})
    EXPECT_EQ(routing[key], expected[key]) << key;
  EXPECT_EQ(routing["ranks"].size(), 2u);
}
