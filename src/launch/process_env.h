// ProcessPlace: where this process sits in a multi-process run (its rank, the world's size,
// its node, the rendezvous store's address), read from the variables a launcher leaves in the
// environment: torchrun's (and `meshsim launch`'s, which sets the same ones), Open MPI's
// mpirun's, or Slurm's srun's.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace meshsim {

struct ProcessPlace {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1, node_rank = 0;
  std::string master_addr; // host of the rendezvous store
  int master_port = 0;
  std::string source; // "torchrun", "Open MPI" or "Slurm": which variables it came from
};

/// The place from `env` (a getenv-like lookup; null = unset). torchrun's variables win, then
/// Open MPI's, then Slurm's; std::nullopt when none is set. A launcher counts as present when
/// one of its rank or size variables is (RANK, WORLD_SIZE, LOCAL_RANK; OMPI_COMM_WORLD_RANK,
/// OMPI_COMM_WORLD_SIZE; SLURM_PROCID, SLURM_NTASKS); MASTER_ADDR alone is not a launcher.
///
/// - torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT are required;
///   LOCAL_WORLD_SIZE defaults to WORLD_SIZE (one node), GROUP_RANK to
///   RANK / LOCAL_WORLD_SIZE.
/// - Open MPI: OMPI_COMM_WORLD_RANK, _SIZE and _LOCAL_RANK are required, _LOCAL_SIZE defaults
///   to the world size. The node is RANK / LOCAL_SIZE (right for mpirun's default by-slot
///   mapping, not for --map-by node): Open MPI has no node-index variable
///   (OMPI_COMM_WORLD_NODE_RANK is a per-node process index). The store is MASTER_ADDR
///   (required), MASTER_PORT (default 29500).
/// - Slurm: SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID are required; the tasks on this node
///   come from SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE ("4", "4(x2)", "2(x3),1": the
///   entry for SLURM_NODEID), else 1; the node is SLURM_NODEID, else RANK / local size. The
///   store is MASTER_ADDR, else SLURM_LAUNCH_NODE_IPADDR; MASTER_PORT, else 29500.
///
/// Throws std::invalid_argument with a one-line message naming the variable for a value that
/// is not an integer, a rank outside [0, world size) (local rank: [0, local world size)), a
/// world size < 1, a port outside 1..65535, or a missing master address.
std::optional<ProcessPlace>
place_from_environment(const std::function<const char*(const char*)>& env);

/// The place from this process's own environment (std::getenv).
std::optional<ProcessPlace> place_from_environment();

} // namespace meshsim
