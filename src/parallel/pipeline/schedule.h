// Pipeline schedules as data: a schedule is one list of actions per stage (forward,
// backward, and the point-to-point sends and receives between neighbouring stages), made by
// pure generator functions and checked by a dry run before any model runs. One executor
// (parallel/pipeline/pipeline.h) runs any schedule. Pure C++: no LibTorch here.
//
// Interleaved schedules (Narayanan et al., SC'21) cut the model into P·V chunks, *virtual
// stages*, and give rank r the chunks r, r+P, r+2P, ... (Megatron-LM's placement). An action
// names its virtual stage, so "3F0" is chunk 3's forward of micro-batch 0, run by rank 3 % P;
// with V = 1 the virtual stage is the stage, and nothing changes.
#pragma once

#include <string>
#include <vector>

namespace meshsim {

enum class ActionKind { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad };

/// One step of one stage. Printed as "2F0" (stage 2 forward of micro-batch 0), "2B0",
/// "2SEND_F0", "2RECV_F0" (activations), "2SEND_B0", "2RECV_B0" (gradients).
struct Action {
  int stage = 0; // the virtual stage (model chunk); rank stage % P runs it
  ActionKind kind = ActionKind::Forward;
  int micro_batch = 0;
  std::string str() const;
  bool operator==(const Action& other) const {
    return stage == other.stage && kind == other.kind && micro_batch == other.micro_batch;
  }
};

/// The inverse of Action::str(). Throws std::invalid_argument on bad text.
Action parse_action(const std::string& text);

/// One list per stage (pipeline rank), run in order. With virtual stages, rank r's list holds
/// the actions of its chunks r, r+P, ...
using Schedule = std::vector<std::vector<Action>>;

/// The tutorials' one-batch model parallelism: one micro-batch, the stages take turns.
Schedule naive_schedule(int stages);
/// GPipe: every forward, then every backward.
Schedule gpipe_schedule(int stages, int micro_batches);
/// PipeDream-flush 1F1B: a warm-up of forwards, steady one-forward-one-backward, a
/// cool-down of backwards. Stage s holds at most min(stages - s, micro_batches) activations.
Schedule one_f_one_b_schedule(int stages, int micro_batches);
/// Megatron-LM's interleaved 1F1B over `virtual_stages` chunks per rank. The forwards run
/// micro-batches in groups of `stages` through each chunk in turn (group 0 through the rank's
/// first chunk, then its second, ..., then group 1), the backwards the same with the chunks in
/// reverse. Rank r warms up with min((P-r-1)·2 + (V-1)·P, M·V) forwards, then alternates one
/// forward and one backward, then runs the backwards left. virtual_stages 1 is
/// one_f_one_b_schedule. Throws std::invalid_argument (one line) for virtual_stages < 1, or
/// for micro_batches not a multiple of stages when virtual_stages > 1 (as Megatron requires).
Schedule interleaved_one_f_one_b_schedule(int stages, int micro_batches, int virtual_stages);
/// "naive" | "gpipe" | "1f1b"; std::invalid_argument otherwise (or for stages or
/// micro_batches < 1). "naive" ignores micro_batches. virtual_stages > 1 makes 1f1b the
/// interleaved schedule; the others refuse it.
Schedule make_schedule(const std::string& name, int stages, int micro_batches,
                       int virtual_stages = 1);
const std::vector<std::string>& schedule_names();

/// One line per stage: "stage 0: 0F0 0SEND_F0 0F1 ...". A schedule with virtual stages
/// names its lines by rank: "rank 0: 0F0 0SEND_F0 0F1 ...".
std::string format_schedule(const Schedule& schedule);

struct DryRun {
  bool ok = false;
  std::string error;      // e.g. "deadlock: stage 1 waits at 1RECV_B3, stage 2 waits at 2RECV_F4"
  int virtual_stages = 1; // chunks per rank: the schedule's virtual stages ÷ its stages
  double makespan = 0;
  /// Idle share of the P ranks' time: 1 - busy / (stages * makespan), busy = M·(F + B) per
  /// rank. 1F1B: (P-1) / (M+P-1).
  double bubble_fraction = 0;
  /// The bubble's time over the ideal time: (makespan - ideal) / ideal, ideal = M·(F + B),
  /// what one rank's work takes with no idle time. Narayanan et al.'s (P-1) / (M·V).
  double bubble_ratio = 0;
  /// Per stage (rank): most micro-batch-chunks forwarded but not yet backwarded, i.e. the
  /// (micro-batch, virtual stage) pairs whose activations the rank holds at once. A chunk is
  /// 1/V of the stage, so with V > 1 divide by V for whole stages' worth of micro-batches.
  std::vector<int> peak_in_flight;
};

/// Simulates the schedule with the given cost per F and B of a whole stage (a virtual
/// stage's F and B cost forward_cost / V and backward_cost / V, so a rank's work is the same
/// for every V; sends are buffered and free, a recv waits for its send), checking that every
/// micro-batch is forwarded and backwarded exactly once per virtual stage, B after F, that
/// sends and recvs pair up, that two ranks' sends and recvs between them come in the same
/// order (NCCL and the cost model match them by order, not by tag), and that it cannot
/// deadlock. Virtual stages are inferred: the largest stage number + 1, a multiple of P.
/// Never throws for a bad schedule: reports it in `error`.
DryRun dry_run(const Schedule& schedule, double forward_cost = 1.0, double backward_cost = 1.0);

} // namespace meshsim
