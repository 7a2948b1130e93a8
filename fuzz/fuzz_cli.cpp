// Fuzzes the command line of `meshsim train` and `meshsim plan`: flag names and values. The
// input's first byte picks the command; the rest, split at line breaks, are the arguments
// (at most 48). They go through CommandLineParser, then what the command checks before it
// does any work: validate(), and for a plan its cluster, its GPUs and check_plannable /
// check_plan_work. Each must accept or refuse in one line (a parse error is printed and
// returned as an exit code; validation throws std::invalid_argument or DataError). Anything
// else escaping, a crash, a hang or undefined behaviour is a bug. --config is left out: it
// names a file to read, which fuzz_config covers.
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.h"
#include "cli/command_line.h"
#include "cost/hardware.h"
#include "fuzz_common.h"
#include "plan/plan.h"

namespace {

void check_before_work(meshsim::CommandLine& line) {
  if (line.command == meshsim::Command::kTrain) {
    meshsim::validate(line.train);
    return;
  }
  meshsim::TrainConfig& c = line.plan;
  if (c.cluster.empty()) return;
  const meshsim::ClusterSpec cluster = meshsim::parse_cluster_spec(c.cluster, c.intra, c.inter);
  if (!line.plan_args.gpus_given) c.gpus = cluster.world_size();
  if (c.gpus != cluster.world_size() || c.gpus > meshsim::kMaxPlannedGpus) return;
  c.data = "synthetic";
  c.device = "meta";
  meshsim::check_plannable(c);
  meshsim::validate(c);
  meshsim::check_plan_work(c, meshsim::kPlanSteps);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<std::string> args = {"meshsim", (data[0] & 1) ? "plan" : "train"};
  std::string current;
  for (size_t i = 1; i < size && args.size() < 50; ++i) {
    if (data[i] == '\n') {
      args.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  args.push_back(current);
  for (const std::string& a : args)
    if (a.rfind("--config", 0) == 0 || a == "-h" || a == "--help" || a == "--help-all")
      return 0;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // One parser for every input, as main() makes one: each parse starts from the defaults.
  static meshsim::CommandLineParser parser;
  if (parser.parse(static_cast<int>(args.size()), argv.data()) >= 0)
    return 0; // refused (printed in one line) before anything ran
  try {
    check_before_work(parser.line());
  } catch (const std::invalid_argument& e) {
    meshsim::fuzz::expect_one_line(e);
  } catch (const meshsim::DataError& e) {
    meshsim::fuzz::expect_one_line(e);
  }
  return 0;
}
