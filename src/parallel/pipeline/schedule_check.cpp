// The dry run: checks a schedule without a model and measures its bubble with a simple event
// simulation (PyTorch pipelining's _simulate_comms_compute, fairscale's clock cycles). A
// schedule with virtual stages is checked chunk by chunk; its ranks are its lists.
#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/pipeline/schedule.h"

namespace meshsim {
namespace {

// The shape a schedule's lists and numbers give it.
struct Shape {
  int ranks = 0;          // lists
  int virtual_stages = 0; // chunks in all: ranks × V
  int micro_batches = 0;
  bool chunked() const { return virtual_stages != ranks; }
  // What a message calls a list: "stage 1" without virtual stages, "rank 1" with them.
  std::string list(int r) const { return (chunked() ? "rank " : "stage ") + std::to_string(r); }
  std::string chunk(int c) const {
    return chunked() ? "virtual stage " + std::to_string(c) : "stage " + std::to_string(c);
  }
};

// A message between two chunks: (is a gradient, sending virtual stage, micro-batch).
using Message = std::tuple<bool, int, int>;

bool is_send(ActionKind k) {
  return k == ActionKind::SendActivation || k == ActionKind::SendGrad;
}
bool is_recv(ActionKind k) {
  return k == ActionKind::RecvActivation || k == ActionKind::RecvGrad;
}

// The message a send or recv of `a` carries.
Message message_of(const Action& a) {
  switch (a.kind) {
  case ActionKind::SendActivation:
    return {false, a.stage, a.micro_batch};
  case ActionKind::SendGrad:
    return {true, a.stage, a.micro_batch};
  case ActionKind::RecvActivation:
    return {false, a.stage - 1, a.micro_batch};
  default: // RecvGrad
    return {true, a.stage + 1, a.micro_batch};
  }
}

// Checks one rank's list on its own: for each of its chunks, each micro-batch forwarded and
// backwarded exactly once, B after F, and exactly the sends and recvs its neighbours need,
// each on the right side of its compute. Returns "" when the list is well formed.
std::string check_rank(const std::vector<Action>& actions, int r, const Shape& shape) {
  // position of each (virtual stage, kind, micro-batch); absent = never run
  std::map<std::tuple<int, ActionKind, int>, int> pos;
  const std::string where = shape.list(r);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.stage < 0 || a.stage % shape.ranks != r)
      return where + " lists " + a.str() + " of another " + (shape.chunked() ? "rank" : "stage");
    if (a.micro_batch < 0)
      return where + " lists a negative micro-batch";
    auto [it, fresh] =
        pos.emplace(std::make_tuple(a.stage, a.kind, a.micro_batch), static_cast<int>(i));
    if (!fresh)
      return where + " runs " + a.str() + " twice";
  }
  for (int c = r; c < shape.virtual_stages; c += shape.ranks) {
    const bool first = c == 0, last = c == shape.virtual_stages - 1;
    const std::string chunk = shape.chunk(c);
    for (int m = 0; m < shape.micro_batches; ++m) {
      auto at = [&](ActionKind k) {
        auto it = pos.find({c, k, m});
        return it == pos.end() ? -1 : it->second;
      };
      auto name = [&](ActionKind k) { return Action{c, k, m}.str(); };
      const int f = at(ActionKind::Forward), b = at(ActionKind::Backward);
      if (f < 0)
        return chunk + " never runs " + name(ActionKind::Forward) +
               " (the forward of micro-batch " + std::to_string(m) + ")";
      if (b < 0)
        return chunk + " never runs " + name(ActionKind::Backward) +
               " (the backward of micro-batch " + std::to_string(m) + ")";
      if (b < f)
        return chunk + " runs " + name(ActionKind::Backward) + " before " +
               name(ActionKind::Forward);
      // (kind, needed, must come before (true) or after (false) the compute at `anchor`)
      const std::tuple<ActionKind, bool, int, bool> comms[] = {
          {ActionKind::RecvActivation, !first, f, true},
          {ActionKind::SendActivation, !last, f, false},
          {ActionKind::RecvGrad, !last, b, true},
          {ActionKind::SendGrad, !first, b, false},
      };
      for (const auto& [kind, needed, anchor, before] : comms) {
        const int p = at(kind);
        if (!needed && p >= 0)
          return chunk + " has no " +
                 (kind == ActionKind::RecvActivation || kind == ActionKind::SendGrad ? "previous"
                                                                                     : "next") +
                 " stage but runs " + name(kind);
        if (needed && p < 0)
          return chunk + " never runs " + name(kind) + " (unmatched by its neighbour)";
        if (needed && before && p > anchor)
          return chunk + " runs " + actions[anchor].str() + " before " + name(kind);
        if (needed && !before && p < anchor)
          return chunk + " runs " + name(kind) + " before " + actions[anchor].str();
      }
    }
  }
  for (const auto& [key, p] : pos)
    if (std::get<2>(key) >= shape.micro_batches)
      return where + " lists " + actions[p].str() + " past the last micro-batch";
  return "";
}

// NCCL matches the sends and recvs between two ranks by their order, and so does the cost
// model's replay (cost/step_program.cpp); the in-process backend matches tags. So that all of
// them see one schedule, the n-th send from a to b must be the n-th recv on b from a.
std::string check_pair_order(const Schedule& schedule, const Shape& shape) {
  const int P = shape.ranks;
  std::map<std::pair<int, int>, std::vector<const Action*>> sends, recvs; // (from, to) -> in order
  for (int r = 0; r < P; ++r)
    for (const Action& a : schedule[r]) {
      if (is_send(a.kind)) {
        const int to = a.kind == ActionKind::SendActivation ? a.stage + 1 : a.stage - 1;
        sends[{r, to % P}].push_back(&a);
      } else if (is_recv(a.kind)) {
        recvs[{std::get<1>(message_of(a)) % P, r}].push_back(&a);
      }
    }
  for (const auto& [pair, sent] : sends) {
    const std::vector<const Action*>& got = recvs[pair];
    for (size_t i = 0; i < sent.size() && i < got.size(); ++i)
      if (message_of(*sent[i]) != message_of(*got[i]))
        return shape.list(pair.second) + "'s receive #" + std::to_string(i + 1) + " from " +
               shape.list(pair.first) + " is " + got[i]->str() + " but its send #" +
               std::to_string(i + 1) + " there is " + sent[i]->str() +
               " (messages between two ranks are matched in order)";
  }
  return "";
}

} // namespace

DryRun dry_run(const Schedule& schedule, double forward_cost, double backward_cost) {
  DryRun r;
  Shape shape;
  shape.ranks = static_cast<int>(schedule.size());
  if (shape.ranks == 0) {
    r.error = "empty schedule: no stages";
    return r;
  }
  for (const auto& list : schedule)
    for (const auto& a : list) {
      shape.micro_batches = std::max(shape.micro_batches, a.micro_batch + 1);
      shape.virtual_stages = std::max(shape.virtual_stages, a.stage + 1);
    }
  if (shape.micro_batches == 0) {
    r.error = "empty schedule: no micro-batches";
    return r;
  }
  // A schedule short of chunks at the end reads as fewer virtual stages; the last one's
  // missing sends then tell.
  shape.virtual_stages = std::max(shape.virtual_stages, shape.ranks);
  if (shape.virtual_stages % shape.ranks != 0) {
    r.error = "the schedule's " + std::to_string(shape.virtual_stages) +
              " virtual stages are not a multiple of its " + std::to_string(shape.ranks) + " ranks";
    return r;
  }
  r.virtual_stages = shape.virtual_stages / shape.ranks;
  for (int s = 0; s < shape.ranks; ++s) {
    r.error = check_rank(schedule[s], s, shape);
    if (!r.error.empty())
      return r;
  }

  // Event simulation: each rank runs its list in order on its own clock; a send posts its
  // message at the sender's clock, a recv waits until that message exists. A chunk's F and B
  // are 1/V of the stage's.
  const int ranks = shape.ranks;
  const double chunk_forward = forward_cost / r.virtual_stages;
  const double chunk_backward = backward_cost / r.virtual_stages;
  std::vector<size_t> next(ranks, 0);
  std::vector<double> clock(ranks, 0.0);
  std::vector<int> in_flight(ranks, 0);
  r.peak_in_flight.assign(ranks, 0);
  std::map<Message, double> posted; // -> time sent
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < ranks; ++s) {
      while (next[s] < schedule[s].size()) {
        const Action& a = schedule[s][next[s]];
        if (is_recv(a.kind)) {
          auto it = posted.find(message_of(a));
          if (it == posted.end())
            break; // its send has not happened yet
          clock[s] = std::max(clock[s], it->second);
        } else if (is_send(a.kind)) {
          posted[message_of(a)] = clock[s];
        } else if (a.kind == ActionKind::Forward) {
          clock[s] += chunk_forward;
          r.peak_in_flight[s] = std::max(r.peak_in_flight[s], ++in_flight[s]);
        } else {
          clock[s] += chunk_backward;
          --in_flight[s];
        }
        ++next[s];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int s = 0; s < ranks; ++s)
    if (next[s] < schedule[s].size())
      stuck +=
          (stuck.empty() ? "" : ", ") + shape.list(s) + " waits at " + schedule[s][next[s]].str();
  if (!stuck.empty()) {
    r.error = "deadlock: " + stuck;
    r.peak_in_flight.clear();
    return r;
  }
  r.error = check_pair_order(schedule, shape);
  if (!r.error.empty()) {
    r.peak_in_flight.clear();
    return r;
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  // What one rank's work takes: M forwards and backwards of a whole stage.
  const double ideal = shape.micro_batches * (forward_cost + backward_cost);
  r.bubble_fraction = r.makespan > 0 ? 1.0 - ideal / r.makespan : 0.0;
  r.bubble_ratio = ideal > 0 ? (r.makespan - ideal) / ideal : 0.0;
  r.ok = true;
  return r;
}

} // namespace meshsim
