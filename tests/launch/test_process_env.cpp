// Tests for place_from_environment(): each launcher's variables give the place, torchrun's win
// over Open MPI's and Open MPI's over Slurm's, missing variables are derived, and bad values
// are refused in one line naming the variable.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "../train/error_of.h"
#include "launch/process_env.h"

namespace meshsim {
namespace {

using testing::error_of;

using ProcessEnvVars = std::map<std::string, std::string>;

std::optional<ProcessPlace> process_place_in(const ProcessEnvVars& vars) {
  return place_from_environment([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

const ProcessEnvVars kTorchrunVars = {{"RANK", "5"},           {"WORLD_SIZE", "8"},
                                      {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
                                      {"GROUP_RANK", "1"},     {"MASTER_ADDR", "node0.cluster"},
                                      {"MASTER_PORT", "29400"}};

const ProcessEnvVars kOpenMpiVars = {
    {"OMPI_COMM_WORLD_RANK", "6"},       {"OMPI_COMM_WORLD_SIZE", "8"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
    {"OMPI_COMM_WORLD_NODE_RANK", "2"},  {"MASTER_ADDR", "10.0.0.7"}};

const ProcessEnvVars kSlurmVars = {{"SLURM_PROCID", "5"},
                                   {"SLURM_NTASKS", "8"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                   {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"}};

ProcessEnvVars vars_with(ProcessEnvVars vars, const std::string& name, const std::string& value) {
  vars[name] = value;
  return vars;
}

ProcessEnvVars vars_without(ProcessEnvVars vars, const std::string& name) {
  vars.erase(name);
  return vars;
}

TEST(ProcessEnv, NoLauncherGivesNothing) {
  EXPECT_FALSE(process_place_in({}).has_value());
  EXPECT_FALSE(process_place_in({{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}}).has_value());
}

TEST(ProcessEnv, TorchrunVariablesGiveThePlace) {
  const auto p = process_place_in(kTorchrunVars);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->source, "torchrun");
  EXPECT_EQ(p->rank, 5);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->local_world_size, 4);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->master_addr, "node0.cluster");
  EXPECT_EQ(p->master_port, 29400);
}

TEST(ProcessEnv, TorchrunDerivesLocalSizeAndNode) {
  // No LOCAL_WORLD_SIZE: one node holding the whole world.
  auto p =
      process_place_in(vars_without(vars_without(kTorchrunVars, "LOCAL_WORLD_SIZE"), "GROUP_RANK"));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->local_world_size, 8);
  EXPECT_EQ(p->node_rank, 0);
  // No GROUP_RANK: ranks are numbered node by node.
  p = process_place_in(vars_with(vars_without(kTorchrunVars, "GROUP_RANK"), "RANK", "6"));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->node_rank, 1);
}

TEST(ProcessEnv, TorchrunWinsThenOpenMpiThenSlurm) {
  ProcessEnvVars all = kSlurmVars;
  all.insert(kOpenMpiVars.begin(), kOpenMpiVars.end());
  EXPECT_EQ(process_place_in(all)->source, "Open MPI");
  all.insert(kTorchrunVars.begin(), kTorchrunVars.end());
  EXPECT_EQ(process_place_in(all)->source, "torchrun");
  EXPECT_EQ(process_place_in(kSlurmVars)->source, "Slurm");
}

TEST(ProcessEnv, OpenMpiVariablesGiveThePlace) {
  const auto p = process_place_in(kOpenMpiVars);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rank, 6);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->local_rank, 2);
  EXPECT_EQ(p->local_world_size, 4);
  // OMPI_COMM_WORLD_NODE_RANK (2) is a per-node process index, not the node.
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->master_addr, "10.0.0.7");
  EXPECT_EQ(p->master_port, 29500);
  EXPECT_EQ(process_place_in(vars_with(kOpenMpiVars, "MASTER_PORT", "1234"))->master_port, 1234);
}

TEST(ProcessEnv, OpenMpiWithoutAddressSaysWhatToExport) {
  EXPECT_EQ(error_of([] { process_place_in(vars_without(kOpenMpiVars, "MASTER_ADDR")); }),
            "Open MPI sets no rendezvous address: export MASTER_ADDR (and MASTER_PORT) to rank "
            "0's host");
}

TEST(ProcessEnv, SlurmVariablesGiveThePlace) {
  auto p = process_place_in(kSlurmVars);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rank, 5);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->local_world_size, 4);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->master_addr, "10.0.0.1");
  EXPECT_EQ(p->master_port, 29500);
  p = process_place_in(
      vars_with(vars_with(kSlurmVars, "MASTER_ADDR", "head"), "MASTER_PORT", "4000"));
  EXPECT_EQ(p->master_addr, "head");
  EXPECT_EQ(p->master_port, 4000);
  EXPECT_NE(error_of([] {
              process_place_in(vars_without(kSlurmVars, "SLURM_LAUNCH_NODE_IPADDR"));
            }).find("Slurm sets no rendezvous address"),
            std::string::npos);
}

TEST(ProcessEnv, SlurmTasksPerNodeForms) {
  const auto local_size = [](const std::string& tasks, const std::string& node) {
    ProcessEnvVars vars = {{"SLURM_PROCID", "0"},           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "0"},          {"SLURM_NODEID", node},
                           {"SLURM_TASKS_PER_NODE", tasks}, {"MASTER_ADDR", "head"}};
    return process_place_in(vars)->local_world_size;
  };
  EXPECT_EQ(local_size("4", "0"), 4);
  EXPECT_EQ(local_size("4(x2)", "1"), 4);
  EXPECT_EQ(local_size("2(x3),1", "2"), 2);
  EXPECT_EQ(local_size("2(x3),1", "3"), 1);
  EXPECT_EQ(local_size("3,5", "1"), 5);
  EXPECT_EQ(local_size("3,5", "7"), 3); // past the list: the leading integer
  EXPECT_EQ(local_size("many", "0"), 1);
  // --ntasks-per-node's variable is the one asked for; unset, srun's list; neither: 1.
  EXPECT_EQ(process_place_in(vars_with(kSlurmVars, "SLURM_NTASKS_PER_NODE", "2"))->local_world_size,
            2);
  EXPECT_EQ(process_place_in(
                vars_with(vars_without(kSlurmVars, "SLURM_TASKS_PER_NODE"), "SLURM_LOCALID", "0"))
                ->local_world_size,
            1);
  EXPECT_EQ(error_of([] { process_place_in(vars_without(kSlurmVars, "SLURM_TASKS_PER_NODE")); }),
            "SLURM_LOCALID=1 is outside [0, 1) given by SLURM_NTASKS_PER_NODE and "
            "SLURM_TASKS_PER_NODE being unset (1 task per node)");
}

TEST(ProcessEnv, RefusalsNameTheVariable) {
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "RANK", "five")); }),
            "RANK=\"five\" is not an integer");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "RANK", "1\n2")); }),
            "RANK=\"1\\x0a2\" is not an integer");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "RANK", "8")); }),
            "RANK=8 is outside [0, 8) given by WORLD_SIZE");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "RANK", "-1")); }),
            "RANK=-1 is outside [0, 8) given by WORLD_SIZE");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "WORLD_SIZE", "0")); }),
            "WORLD_SIZE=0: the world size must be at least 1");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "LOCAL_RANK", "4")); }),
            "LOCAL_RANK=4 is outside [0, 4) given by LOCAL_WORLD_SIZE");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kTorchrunVars, "MASTER_PORT", "70000")); }),
            "MASTER_PORT=70000 is outside 1..65535");
  EXPECT_EQ(
      error_of([] { process_place_in(vars_with(kTorchrunVars, "MASTER_PORT", "99999999999")); }),
      "MASTER_PORT=\"99999999999\" is not an integer");
  EXPECT_EQ(error_of([] { process_place_in(vars_without(kTorchrunVars, "MASTER_ADDR")); }),
            "torchrun sets no rendezvous address: MASTER_ADDR is not set");
  EXPECT_EQ(error_of([] { process_place_in(vars_without(kTorchrunVars, "WORLD_SIZE")); }),
            "WORLD_SIZE is not set, but other torchrun variables are");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kOpenMpiVars, "OMPI_COMM_WORLD_SIZE", "")); }),
            "OMPI_COMM_WORLD_SIZE=\"\" is not an integer");
  EXPECT_EQ(error_of([] { process_place_in(vars_with(kSlurmVars, "SLURM_LOCALID", "4")); }),
            "SLURM_LOCALID=4 is outside [0, 4) given by SLURM_TASKS_PER_NODE=\"4(x2)\"");
}

} // namespace
} // namespace meshsim
