// Pipeline schedules as data: a schedule is one list of actions per stage (forward,
// backward, and the point-to-point sends and receives between neighbouring stages), made by
// pure generator functions and checked by a dry run before any model runs. One executor
// (parallel/pipeline.h) runs any schedule. Pure C++: no LibTorch here.
#pragma once

#include <string>
#include <vector>

namespace meshsim {

enum class ActionKind { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad };

/// One step of one stage. Printed as "2F0" (stage 2 forward of micro-batch 0), "2B0",
/// "2SEND_F0", "2RECV_F0" (activations), "2SEND_B0", "2RECV_B0" (gradients).
struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::Forward;
  int micro_batch = 0;
  std::string str() const;
  bool operator==(const Action& other) const {
    return stage == other.stage && kind == other.kind && micro_batch == other.micro_batch;
  }
};

/// The inverse of Action::str(). Throws std::invalid_argument on bad text.
Action parse_action(const std::string& text);

/// One list per stage, run in order.
using Schedule = std::vector<std::vector<Action>>;

/// The tutorials' one-batch model parallelism: one micro-batch, the stages take turns.
Schedule naive_schedule(int stages);
/// GPipe: every forward, then every backward.
Schedule gpipe_schedule(int stages, int micro_batches);
/// PipeDream-flush 1F1B: a warm-up of forwards, steady one-forward-one-backward, a
/// cool-down of backwards. Stage s holds at most min(stages - s, micro_batches) activations.
Schedule one_f_one_b_schedule(int stages, int micro_batches);
/// "naive" | "gpipe" | "1f1b"; std::invalid_argument otherwise (or for stages or
/// micro_batches < 1). "naive" ignores micro_batches.
Schedule make_schedule(const std::string& name, int stages, int micro_batches);
const std::vector<std::string>& schedule_names();

/// One line per stage: "stage 0: 0F0 0SEND_F0 0F1 ...".
std::string format_schedule(const Schedule& schedule);

struct DryRun {
  bool ok = false;
  std::string error; // e.g. "deadlock: stage 1 waits at 1RECV_B3, stage 2 waits at 2RECV_F4"
  double makespan = 0;
  double bubble_fraction = 0; // 1 - busy / (stages * makespan)
  /// Per stage: most micro-batches forwarded but not yet backwarded (activations held).
  std::vector<int> peak_in_flight;
};

/// Simulates the schedule with the given cost per F and B (sends are buffered and free, a
/// recv waits for its send), checking that every micro-batch is forwarded and backwarded
/// exactly once per stage, B after F, that sends and recvs pair up, and that it cannot
/// deadlock. Never throws for a bad schedule: reports it in `error`.
DryRun dry_run(const Schedule& schedule, double forward_cost = 1.0, double backward_cost = 1.0);

} // namespace meshsim
