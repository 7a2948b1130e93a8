// Pipeline schedule generators and the action text format. The dry run that checks a schedule
// is in schedule_check.cpp.
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <stdexcept>

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

Schedule interleaved_one_f_one_b_schedule(int stages, int micro_batches, int virtual_stages) {
  check_shape(stages, micro_batches);
  if (virtual_stages < 1)
    throw std::invalid_argument("a pipeline needs at least 1 virtual stage per rank, got " +
                                std::to_string(virtual_stages));
  if (virtual_stages == 1)
    return one_f_one_b_schedule(stages, micro_batches);
  if (stages < 2)
    throw std::invalid_argument("virtual stages interleave the chunks of 2 or more stages, got " +
                                std::to_string(stages) + " stage");
  if (micro_batches % stages != 0)
    throw std::invalid_argument("the interleaved schedule runs micro-batches in groups of the " +
                                std::to_string(stages) +
                                " stages: " + std::to_string(micro_batches) +
                                " micro-batches is not a multiple of " + std::to_string(stages));
  const int P = stages, V = virtual_stages, chunks = P * V, total = micro_batches * V;
  // The k-th forward (backward) of every rank runs this chunk (0..V-1 of the rank's) and
  // micro-batch: groups of P micro-batches, each through the chunks in turn (Megatron's
  // get_model_chunk_id); backwards take the chunks last to first.
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % chunks) / P;
    return forward ? c : V - 1 - c;
  };
  auto micro_batch_of = [&](int k) { return (k / chunks) * P + k % P; };
  Schedule out(P);
  for (int r = 0; r < P; ++r) {
    // Megatron's num_warmup_microbatches. The rank's first backward is micro-batch 0 through
    // its last chunk: (V-1)·P forwards bring micro-batch 0 there, and while it goes on
    // through the P-r-1 ranks after this one and its gradient comes back, this rank has time
    // for two forwards per rank.
    const int warmup = std::min((P - r - 1) * 2 + (V - 1) * P, total);
    int f = 0, b = 0;
    auto forward = [&] {
      add_forward(out[r], r + chunk_of(f, true) * P, chunks, micro_batch_of(f));
      ++f;
    };
    auto backward = [&] {
      add_backward(out[r], r + chunk_of(b, false) * P, chunks, micro_batch_of(b));
      ++b;
    };
    while (f < warmup)
      forward();
    while (f < total) {
      forward();
      backward();
    }
    while (b < total)
      backward();
  }
  return out;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"naive", "gpipe", "1f1b"};
  return names;
}

Schedule make_schedule(const std::string& name, int stages, int micro_batches, int virtual_stages) {
  if (name == "1f1b")
    return interleaved_one_f_one_b_schedule(stages, micro_batches, virtual_stages);
  if (name != "naive" && name != "gpipe")
    throw std::invalid_argument("unknown pipeline schedule '" + name +
                                "' (expected naive, gpipe or 1f1b)");
  if (virtual_stages != 1)
    throw std::invalid_argument("virtual stages run with the 1f1b schedule, not " + name);
  if (name == "gpipe")
    return gpipe_schedule(stages, micro_batches);
  check_shape(stages, 1);
  return naive_schedule(stages);
}

std::string format_schedule(const Schedule& schedule) {
  bool chunked = false; // a list holding another list's virtual stage
  for (size_t s = 0; s < schedule.size(); ++s)
    for (const auto& a : schedule[s])
      chunked = chunked || a.stage != static_cast<int>(s);
  std::ostringstream out;
  for (size_t s = 0; s < schedule.size(); ++s) {
    out << (chunked ? "rank " : "stage ") << s << ":";
    for (const auto& a : schedule[s])
      out << ' ' << a.str();
    out << '\n';
  }
  return out.str();
}

} // namespace meshsim
