// Replay: re-times one step of per-rank work on a target cluster.
//
// Each rank has two in-order streams, compute and comm (like a CUDA compute stream and an NCCL
// stream), and a second comm stream for gradient reductions (Task::stream). A task starts when
// the task before it on the same rank and stream has ended and every task it depends on has
// ended; a collective starts when every member's instance is ready, and all members finish it
// together. Durations come from the task itself (already costed on the target) or from
// roofline.h / collective_cost.h.
//
// The structs are plain so tests can hand-build them and the run wiring can fill them from a
// recorded run. Task ids are strings, unique across the whole program.
#pragma once

#include <string>
#include <vector>

#include "cost/collective_cost.h"
#include "cost/hardware.h"
#include "cost/roofline.h"

namespace meshsim {

enum class TaskKind { Compute, Comm };

struct Task {
  std::string id; // unique across all ranks; what `deps` refer to
  TaskKind kind = TaskKind::Compute;
  /// >= 0: the time on the target, used as is. < 0: cost the task from `work` (compute) or
  /// from op/group/bytes (comm).
  double duration_s = -1;
  ComputeWork work; // compute only, when duration_s < 0

  // Comm only.
  CollectiveOp op = CollectiveOp::AllReduce;
  std::vector<int> group; // global ranks; send/recv: {sender, receiver}
  double bytes = 0;       // collective_cost.h convention (all_gather: total output size)
  /// all_to_all: the bytes this rank sends each member, in group order (empty: an even
  /// split of `bytes`). Members' instances may differ here; the busiest sets the time
  /// (all_to_all_cost).
  std::vector<double> peer_bytes{};
  /// Instances with the same key on different ranks are one collective. Empty: derived as
  /// op + group + "k-th such call on this rank", which is NCCL's matching rule (members call
  /// a group's collectives in the same order).
  std::string key;
  /// Comm only: 0 the rank's comm stream; 1 a second one, for data parallelism's gradient
  /// reductions, which frameworks issue on a stream (and communicator) of their own, so that
  /// they run beside tensor parallelism's collectives (links shared by both are not modelled).
  int stream = 0;

  std::vector<std::string> deps; // task ids on any rank that must end before this starts

  static Task compute(std::string id, double seconds, std::vector<std::string> deps = {});
  static Task compute(std::string id, const ComputeWork& work, std::vector<std::string> deps = {});
  static Task comm(std::string id, CollectiveOp op, std::vector<int> group, double bytes,
                   std::vector<std::string> deps = {}, std::string key = "");
};

/// ranks[r] is rank r's tasks in issue order (both streams interleaved as issued).
struct Program {
  std::vector<std::vector<Task>> ranks;
};

struct ReplayOptions {
  Efficiency efficiency;                 // for compute tasks costed from `work`
  Algorithm algorithm = Algorithm::Auto; // for all_reduce tasks costed by the model
  /// A rank with no tasks is an image of ranks that have them (a plan executes one rank per
  /// symmetry class): a collective is complete with its present members' instances, since
  /// the images arrive at the same moments, and its cost is still that of the whole group.
  /// The bubble fraction then covers the present ranks only. An absent member of an
  /// all_to_all sends as its first present member does, shifted to its own place in the group.
  bool absent_ranks_are_images = false;
};

struct TaskTiming {
  std::string id;
  int rank = 0;
  TaskKind kind = TaskKind::Compute;
  double ready_s = 0; // own stream and deps done (a collective may still wait for peers)
  double start_s = 0;
  double end_s = 0;
};

struct RankStats {
  double compute_busy_s = 0; // time the compute stream runs a task
  double comm_busy_s = 0;    // time the comm stream runs a collective (not waiting for peers)
  double exposed_comm_s = 0; // comm running while the compute stream is idle
  double compute_idle_s = 0; // makespan - compute_busy_s
};

struct ReplayResult {
  std::vector<TaskTiming> tasks; // program order: rank 0's tasks, then rank 1's, ...
  std::vector<RankStats> ranks;
  double makespan_s = 0;      // step time: last task end (the step starts at 0)
  double bubble_fraction = 0; // sum of compute_idle_s / (ranks * makespan_s)

  const TaskTiming& task(const std::string& id) const; // std::out_of_range if unknown
  double max_exposed_comm_s() const;
};

/// Replays `program` on `cluster` (ranks.size() must not exceed its world size).
/// Malformed input (duplicate or unknown ids, a collective whose members disagree or are
/// missing) throws std::invalid_argument; a dependency cycle or a collective some member can
/// never reach (a deadlock) throws std::runtime_error naming the stuck tasks.
ReplayResult replay(const Program& program, const ClusterSpec& cluster,
                    const ReplayOptions& options = {});

} // namespace meshsim
