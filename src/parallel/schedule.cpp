// Pipeline schedule generators, the action text format, and the dry run that checks a
// schedule and measures its bubble with a simple event simulation (PyTorch
// pipelining's _simulate_comms_compute, fairscale's clock cycles).
#include "parallel/schedule.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace meshsim {
namespace {

struct KindName {
  ActionKind kind;
  const char* text;
};

// Longest names first, so "SEND_F" is not read as "S..." and "F" only matches alone.
const KindName kKindNames[] = {
    {ActionKind::SendActivation, "SEND_F"},
    {ActionKind::RecvActivation, "RECV_F"},
    {ActionKind::SendGrad, "SEND_B"},
    {ActionKind::RecvGrad, "RECV_B"},
    {ActionKind::Forward, "F"},
    {ActionKind::Backward, "B"},
};

const char* kind_text(ActionKind kind) {
  for (const auto& k : kKindNames)
    if (k.kind == kind)
      return k.text;
  return "?";
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9)
    return false; // 9 digits always fit in an int
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

void check_shape(int stages, int micro_batches) {
  if (stages < 1)
    throw std::invalid_argument("a pipeline needs at least 1 stage, got " + std::to_string(stages));
  if (micro_batches < 1)
    throw std::invalid_argument("a pipeline needs at least 1 micro-batch, got " +
                                std::to_string(micro_batches));
}

// Appends a forward with its receive before and its send after, where the stage has neighbours.
void add_forward(std::vector<Action>& out, int s, int stages, int m) {
  if (s > 0)
    out.push_back({s, ActionKind::RecvActivation, m});
  out.push_back({s, ActionKind::Forward, m});
  if (s < stages - 1)
    out.push_back({s, ActionKind::SendActivation, m});
}

void add_backward(std::vector<Action>& out, int s, int stages, int m) {
  if (s < stages - 1)
    out.push_back({s, ActionKind::RecvGrad, m});
  out.push_back({s, ActionKind::Backward, m});
  if (s > 0)
    out.push_back({s, ActionKind::SendGrad, m});
}

// Checks one stage's list on its own: each micro-batch forwarded and backwarded exactly once,
// B after F, and exactly the sends and recvs its neighbours need, each on the right side of
// its compute. Returns "" when the list is well formed.
std::string check_stage(const std::vector<Action>& actions, int s, int stages, int micro_batches) {
  // position of each (kind, micro-batch); -1 = absent
  std::map<std::pair<ActionKind, int>, int> pos;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.stage != s)
      return "stage " + std::to_string(s) + " lists " + a.str() + " of another stage";
    if (a.micro_batch < 0)
      return "stage " + std::to_string(s) + " lists a negative micro-batch";
    auto [it, fresh] = pos.emplace(std::make_pair(a.kind, a.micro_batch), static_cast<int>(i));
    if (!fresh)
      return "stage " + std::to_string(s) + " runs " + a.str() + " twice";
  }
  const bool first = s == 0, last = s == stages - 1;
  for (int m = 0; m < micro_batches; ++m) {
    auto at = [&](ActionKind k) {
      auto it = pos.find({k, m});
      return it == pos.end() ? -1 : it->second;
    };
    auto name = [&](ActionKind k) { return Action{s, k, m}.str(); };
    const std::string where = "stage " + std::to_string(s);
    const int f = at(ActionKind::Forward), b = at(ActionKind::Backward);
    if (f < 0)
      return where + " never runs " + name(ActionKind::Forward) + " (the forward of micro-batch " +
             std::to_string(m) + ")";
    if (b < 0)
      return where + " never runs " + name(ActionKind::Backward) +
             " (the backward of micro-batch " + std::to_string(m) + ")";
    if (b < f)
      return where + " runs " + name(ActionKind::Backward) + " before " + name(ActionKind::Forward);
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
        return where + " has no " +
               (kind == ActionKind::RecvActivation || kind == ActionKind::SendGrad ? "previous"
                                                                                   : "next") +
               " stage but runs " + name(kind);
      if (needed && p < 0)
        return where + " never runs " + name(kind) + " (unmatched by its neighbour)";
      if (needed && before && p > anchor)
        return where + " runs " + actions[anchor].str() + " before " + name(kind);
      if (needed && !before && p < anchor)
        return where + " runs " + name(kind) + " before " + actions[anchor].str();
    }
  }
  for (const auto& [key, p] : pos)
    if (key.second >= micro_batches)
      return "stage " + std::to_string(s) + " lists " + actions[p].str() +
             " past the last micro-batch";
  return "";
}

} // namespace

std::string Action::str() const {
  return std::to_string(stage) + kind_text(kind) + std::to_string(micro_batch);
}

Action parse_action(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])))
    ++i;
  const std::string stage = text.substr(0, i);
  if (!all_digits(stage))
    throw std::invalid_argument("bad pipeline action '" + text +
                                "': expected a stage number first, as in 2F0");
  for (const auto& k : kKindNames) {
    const std::string name = k.text;
    if (text.compare(i, name.size(), name) != 0)
      continue;
    const std::string mb = text.substr(i + name.size());
    if (!all_digits(mb))
      break;
    return Action{std::stoi(stage), k.kind, std::stoi(mb)};
  }
  throw std::invalid_argument(
      "bad pipeline action '" + text +
      "': expected <stage><F|B|SEND_F|RECV_F|SEND_B|RECV_B><micro-batch>, as in 2F0");
}

Schedule naive_schedule(int stages) {
  return gpipe_schedule(stages, 1);
}

Schedule gpipe_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches);
  Schedule out(stages);
  for (int s = 0; s < stages; ++s) {
    for (int m = 0; m < micro_batches; ++m)
      add_forward(out[s], s, stages, m);
    for (int m = 0; m < micro_batches; ++m)
      add_backward(out[s], s, stages, m);
  }
  return out;
}

Schedule one_f_one_b_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches);
  Schedule out(stages);
  for (int s = 0; s < stages; ++s) {
    // Stage s runs ahead by the number of stages after it, so that once the last stage
    // starts its first backward, every stage alternates and holds at most stages - s.
    const int warmup = std::min(stages - 1 - s, micro_batches);
    int f = 0, b = 0;
    while (f < warmup)
      add_forward(out[s], s, stages, f++);
    while (f < micro_batches) {
      add_forward(out[s], s, stages, f++);
      add_backward(out[s], s, stages, b++);
    }
    while (b < micro_batches)
      add_backward(out[s], s, stages, b++);
  }
  return out;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"naive", "gpipe", "1f1b"};
  return names;
}

Schedule make_schedule(const std::string& name, int stages, int micro_batches) {
  if (name == "naive") {
    check_shape(stages, 1);
    return naive_schedule(stages);
  }
  if (name == "gpipe")
    return gpipe_schedule(stages, micro_batches);
  if (name == "1f1b")
    return one_f_one_b_schedule(stages, micro_batches);
  throw std::invalid_argument("unknown pipeline schedule '" + name +
                              "' (expected naive, gpipe or 1f1b)");
}

std::string format_schedule(const Schedule& schedule) {
  std::ostringstream out;
  for (size_t s = 0; s < schedule.size(); ++s) {
    out << "stage " << s << ":";
    for (const auto& a : schedule[s])
      out << ' ' << a.str();
    out << '\n';
  }
  return out.str();
}

DryRun dry_run(const Schedule& schedule, double forward_cost, double backward_cost) {
  DryRun r;
  const int stages = static_cast<int>(schedule.size());
  if (stages == 0) {
    r.error = "empty schedule: no stages";
    return r;
  }
  int micro_batches = 0;
  for (const auto& list : schedule)
    for (const auto& a : list)
      micro_batches = std::max(micro_batches, a.micro_batch + 1);
  if (micro_batches == 0) {
    r.error = "empty schedule: no micro-batches";
    return r;
  }
  for (int s = 0; s < stages; ++s) {
    r.error = check_stage(schedule[s], s, stages, micro_batches);
    if (!r.error.empty())
      return r;
  }

  // Event simulation: each stage runs its list in order on its own clock; a send posts its
  // message at the sender's clock, a recv waits until that message exists.
  std::vector<size_t> next(stages, 0);
  std::vector<double> clock(stages, 0.0);
  std::vector<int> in_flight(stages, 0);
  r.peak_in_flight.assign(stages, 0);
  std::map<std::tuple<bool, int, int>, double> posted; // (is_grad, from stage, mb) -> time
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < schedule[s].size()) {
        const Action& a = schedule[s][next[s]];
        if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGrad) {
          const bool grad = a.kind == ActionKind::RecvGrad;
          auto it = posted.find({grad, grad ? s + 1 : s - 1, a.micro_batch});
          if (it == posted.end())
            break; // its send has not happened yet
          clock[s] = std::max(clock[s], it->second);
        } else if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad) {
          posted[{a.kind == ActionKind::SendGrad, s, a.micro_batch}] = clock[s];
        } else if (a.kind == ActionKind::Forward) {
          clock[s] += forward_cost;
          r.peak_in_flight[s] = std::max(r.peak_in_flight[s], ++in_flight[s]);
        } else {
          clock[s] += backward_cost;
          --in_flight[s];
        }
        ++next[s];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int s = 0; s < stages; ++s)
    if (next[s] < schedule[s].size())
      stuck += (stuck.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) +
               " waits at " + schedule[s][next[s]].str();
  if (!stuck.empty()) {
    r.error = "deadlock: " + stuck;
    r.peak_in_flight.clear();
    return r;
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  const double busy = static_cast<double>(stages) * micro_batches * (forward_cost + backward_cost);
  r.bubble_fraction = r.makespan > 0 ? 1.0 - busy / (stages * r.makespan) : 0.0;
  r.ok = true;
  return r;
}

} // namespace meshsim
