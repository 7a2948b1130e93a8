// place_from_environment(): the variables of torchrun, Open MPI and Slurm, read and checked.
#include "launch/process_env.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>

#include <fmt/format.h>

#include "base/printable.h"

namespace meshsim {
namespace {

using EnvLookup = std::function<const char*(const char*)>;

constexpr int kDefaultMasterPort = 29500; // torchrun's and torch.distributed's default

/// The value of `name` as an integer; std::nullopt when unset.
std::optional<int> env_integer(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  if (!value)
    return std::nullopt;
  const std::string text = value;
  int out = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, out);
  if (text.empty() || error != std::errc() || stop != end)
    throw std::invalid_argument(fmt::format("{}=\"{}\" is not an integer", name, printable(text)));
  return out;
}

/// The value of a variable its launcher always sets.
int env_required(const EnvLookup& env, const char* name, const char* source) {
  const auto value = env_integer(env, name);
  if (!value)
    throw std::invalid_argument(
        fmt::format("{} is not set, but other {} variables are", name, source));
  return *value;
}

/// The text of `name`; "" when unset.
std::string env_text(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  return value ? value : "";
}

/// Where each field of a place came from, for the messages of env_check.
struct EnvNames {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  std::string local_world_size; // a variable, or how the size was found
  std::string node_rank;
};

void env_check(const ProcessPlace& p, const EnvNames& n) {
  if (p.world_size < 1)
    throw std::invalid_argument(
        fmt::format("{}={}: the world size must be at least 1", n.world_size, p.world_size));
  if (p.rank < 0 || p.rank >= p.world_size)
    throw std::invalid_argument(fmt::format("{}={} is outside [0, {}) given by {}", n.rank, p.rank,
                                            p.world_size, n.world_size));
  if (p.local_world_size < 1)
    throw std::invalid_argument(fmt::format("{}={}: the number of processes on a node must be "
                                            "at least 1",
                                            n.local_world_size, p.local_world_size));
  if (p.local_rank < 0 || p.local_rank >= p.local_world_size)
    throw std::invalid_argument(fmt::format("{}={} is outside [0, {}) given by {}", n.local_rank,
                                            p.local_rank, p.local_world_size, n.local_world_size));
  if (p.node_rank < 0 || p.node_rank >= p.world_size)
    throw std::invalid_argument(fmt::format("{}={} is outside [0, {}) given by {}", n.node_rank,
                                            p.node_rank, p.world_size, n.world_size));
  if (p.master_port < 1 || p.master_port > 65535)
    throw std::invalid_argument(fmt::format("MASTER_PORT={} is outside 1..65535", p.master_port));
}

/// MASTER_PORT, or the default when it is unset.
int env_master_port(const EnvLookup& env) {
  return env_integer(env, "MASTER_PORT").value_or(kDefaultMasterPort);
}

ProcessPlace env_torchrun(const EnvLookup& env) {
  ProcessPlace p;
  p.source = "torchrun";
  p.rank = env_required(env, "RANK", "torchrun");
  p.world_size = env_required(env, "WORLD_SIZE", "torchrun");
  p.local_rank = env_required(env, "LOCAL_RANK", "torchrun");
  const auto local_size = env_integer(env, "LOCAL_WORLD_SIZE");
  // Without LOCAL_WORLD_SIZE (torch.distributed.launch sets none), the run is taken as one node.
  p.local_world_size = local_size.value_or(p.world_size);
  const auto group_rank = env_integer(env, "GROUP_RANK");
  // torchrun numbers ranks node by node, so the node follows from the rank.
  p.node_rank = group_rank.value_or(p.local_world_size > 0 ? p.rank / p.local_world_size : 0);
  p.master_port = env_required(env, "MASTER_PORT", "torchrun");
  p.master_addr = env_text(env, "MASTER_ADDR");
  env_check(p, {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                local_size ? "LOCAL_WORLD_SIZE" : "WORLD_SIZE (LOCAL_WORLD_SIZE is unset)",
                group_rank ? "GROUP_RANK" : "RANK / LOCAL_WORLD_SIZE"});
  if (p.master_addr.empty())
    throw std::invalid_argument(
        fmt::format("torchrun sets no rendezvous address: MASTER_ADDR is {}",
                    env("MASTER_ADDR") ? "empty" : "not set"));
  return p;
}

ProcessPlace env_open_mpi(const EnvLookup& env) {
  ProcessPlace p;
  p.source = "Open MPI";
  p.rank = env_required(env, "OMPI_COMM_WORLD_RANK", "Open MPI");
  p.world_size = env_required(env, "OMPI_COMM_WORLD_SIZE", "Open MPI");
  p.local_rank = env_required(env, "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI");
  const auto local_size = env_integer(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
  p.local_world_size = local_size.value_or(p.world_size);
  // OMPI_COMM_WORLD_NODE_RANK is not the node's index (it counts processes on the node across
  // all jobs); with mpirun's default by-slot mapping each node holds a contiguous block.
  p.node_rank = p.local_world_size > 0 ? p.rank / p.local_world_size : 0;
  p.master_port = env_master_port(env);
  p.master_addr = env_text(env, "MASTER_ADDR");
  env_check(p, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                local_size ? "OMPI_COMM_WORLD_LOCAL_SIZE"
                           : "OMPI_COMM_WORLD_SIZE (OMPI_COMM_WORLD_LOCAL_SIZE is unset)",
                "OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_LOCAL_SIZE"});
  if (p.master_addr.empty())
    throw std::invalid_argument("Open MPI sets no rendezvous address: export MASTER_ADDR (and "
                                "MASTER_PORT) to rank 0's host");
  return p;
}

/// The leading integer of `text` from `at` on, moving `at` past it; -1 when there is none.
int env_leading_integer(const std::string& text, size_t& at) {
  int value = 0;
  const auto [stop, error] = std::from_chars(text.data() + at, text.data() + text.size(), value);
  if (error != std::errc() || value < 0)
    return -1;
  at = static_cast<size_t>(stop - text.data());
  return value;
}

/// Slurm's tasks on node `node` from a list like "2(x3),1"; the leading integer when the list
/// does not parse or `node` is unknown (-1) or past its end; 1 when there is none.
int env_slurm_tasks_on_node(const std::string& text, int node) {
  size_t at = 0;
  const int leading = env_leading_integer(text, at);
  if (leading < 0)
    return 1;
  at = 0;
  while (node >= 0 && at < text.size()) {
    const int count = env_leading_integer(text, at);
    int repeat = 1;
    if (count < 0)
      break;
    if (text.compare(at, 2, "(x") == 0) {
      at += 2;
      repeat = env_leading_integer(text, at);
      if (repeat < 0 || at >= text.size() || text[at] != ')')
        break;
      ++at;
    }
    if (node < repeat)
      return count;
    node -= repeat;
    if (at < text.size() && text[at] != ',')
      break;
    ++at;
  }
  return leading;
}

ProcessPlace env_slurm(const EnvLookup& env) {
  ProcessPlace p;
  p.source = "Slurm";
  p.rank = env_required(env, "SLURM_PROCID", "Slurm");
  p.world_size = env_required(env, "SLURM_NTASKS", "Slurm");
  p.local_rank = env_required(env, "SLURM_LOCALID", "Slurm");
  const auto node_id = env_integer(env, "SLURM_NODEID");
  std::string size_from =
      "SLURM_NTASKS_PER_NODE and SLURM_TASKS_PER_NODE being unset (1 task per node)";
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (const char* value = env(name)) {
      p.local_world_size = env_slurm_tasks_on_node(value, node_id.value_or(-1));
      size_from = fmt::format("{}=\"{}\"", name, printable(value));
      break;
    }
  }
  p.node_rank = node_id.value_or(p.local_world_size > 0 ? p.rank / p.local_world_size : 0);
  p.master_port = env_master_port(env);
  p.master_addr = env_text(env, "MASTER_ADDR");
  if (p.master_addr.empty())
    p.master_addr = env_text(env, "SLURM_LAUNCH_NODE_IPADDR");
  env_check(p, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", size_from,
                node_id ? "SLURM_NODEID" : "SLURM_PROCID / tasks per node"});
  if (p.master_addr.empty())
    throw std::invalid_argument("Slurm sets no rendezvous address (MASTER_ADDR and "
                                "SLURM_LAUNCH_NODE_IPADDR are unset): export MASTER_ADDR (and "
                                "MASTER_PORT) to rank 0's host");
  return p;
}

bool env_has_any(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (env(name))
      return true;
  return false;
}

} // namespace

std::optional<ProcessPlace> place_from_environment(const EnvLookup& env) {
  if (env_has_any(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK"}))
    return env_torchrun(env);
  if (env_has_any(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}))
    return env_open_mpi(env);
  if (env_has_any(env, {"SLURM_PROCID", "SLURM_NTASKS"}))
    return env_slurm(env);
  return std::nullopt;
}

std::optional<ProcessPlace> place_from_environment() {
  return place_from_environment([](const char* name) -> const char* { return std::getenv(name); });
}

} // namespace meshsim
