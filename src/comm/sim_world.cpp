// The in-process world: the rendezvous every collective shares, the waits it keeps for the
// timeout's message, and abort. See sim_backend.h.
#include "comm/sim_backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace meshsim {
namespace {

std::string describe(const std::string& op, int64_t numel, c10::ScalarType dtype) {
  return fmt::format("{} of {} {} elements", op, numel, c10::toString(dtype));
}

} // namespace

SimWorld::SimWorld(int world_size, std::chrono::milliseconds timeout, const RunClock* clock)
    : world_size_(world_size), timeout_(timeout), clock_(clock) {
  if (world_size < 1)
    throw std::invalid_argument("world size must be at least 1");
  waits_.resize(static_cast<size_t>(world_size));
}

std::vector<int> SimWorld::waited_by(int rank) const {
  const Wait& w = waits_[static_cast<size_t>(rank)];
  if (w.src >= 0)
    return {w.src};
  std::vector<int> missing;
  if (w.slot)
    for (size_t j = 0; j < w.group.size(); ++j)
      if (!w.slot->present[j])
        missing.push_back(w.group[j]);
  return missing;
}

std::string SimWorld::wait_chain(const std::vector<int>& missing) const {
  // A rank that is missing but blocked itself is not the cause: follow its waits (each rank
  // once) to one that waits for nobody.
  std::string chain;
  std::vector<bool> seen(static_cast<size_t>(world_size_), false);
  int at = missing.empty() ? -1 : missing.front();
  while (at >= 0 && !seen[static_cast<size_t>(at)]) {
    seen[static_cast<size_t>(at)] = true;
    const std::vector<int> next = waited_by(at);
    if (next.empty())
      break;
    chain += fmt::format("{}rank {} waits for rank{} {}", chain.empty() ? " (" : ", ", at,
                         next.size() > 1 ? "s" : "", fmt::join(next, ", "));
    at = next.front();
  }
  return chain.empty() ? chain : chain + ")";
}

SimWorld::~SimWorld() = default;

void SimWorld::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty())
      abort_reason_ = reason.empty() ? "aborted" : reason;
  }
  cv_.notify_all();
}

bool SimWorld::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !abort_reason_.empty();
}

void SimWorld::rendezvous(const Arrival& a, DeviceEvent ready,
                          const std::function<void(Slot&, int)>& work) {
  const auto& [rank, op, ranks, key, seq, index, numel, dtype, on_card, root, in, out, in_splits,
               out_splits] = a;
  const int n = static_cast<int>(ranks.size());
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!abort_reason_.empty())
      throw RankAborted(abort_reason_);
    auto& entry = slots_[{key, seq}];
    if (!entry) {
      entry = std::make_shared<Slot>();
      entry->op = op;
      entry->numel = numel;
      entry->dtype = dtype;
      entry->root = root;
      entry->in.assign(n, nullptr);
      entry->out.assign(n, nullptr);
      entry->present.assign(n, false);
      entry->on_card = on_card;
      entry->in_splits.resize(n);
      entry->out_splits.resize(n);
      if (on_card) {
        entry->ready.resize(n);
        entry->done.resize(n);
      }
    } else if (entry->op != op || entry->numel != numel || entry->dtype != dtype ||
               entry->root != root || entry->on_card != on_card) {
      throw CollectiveMismatch(fmt::format(
          "collective #{} on group [{}]: rank {} called {}{} but another rank called {}{}", seq,
          key, rank, describe(op, numel, dtype), on_card ? " on the card" : "",
          describe(entry->op, entry->numel, entry->dtype), entry->on_card ? " on the card" : ""));
    }
    slot = entry;
    slot->in[index] = in;
    slot->out[index] = out;
    slot->present[index] = true;
    slot->in_splits[index] = in_splits;
    slot->out_splits[index] = out_splits;
    if (on_card)
      slot->ready[index] = std::move(ready);
    if (++slot->arrived == n)
      cv_.notify_all();
    waits_[rank] = Wait{slot, ranks, -1};
    const bool all_here = cv_.wait_for(lock, timeout_, [&] {
      return slot->arrived == n || !abort_reason_.empty();
    });
    if (all_here)
      waits_[rank] = Wait{};
    if (!abort_reason_.empty())
      throw RankAborted(abort_reason_);
    if (!all_here) {
      std::vector<int> missing;
      for (int j = 0; j < n; ++j)
        if (!slot->present[j])
          missing.push_back(ranks[j]);
      throw CollectiveTimeout(fmt::format(
          "{} #{} on group [{}] timed out after {:.1f} s: rank{} {} never arrived{}", op, seq,
          key, timeout_.count() / 1000.0, missing.size() > 1 ? "s" : "",
          fmt::join(missing, ", "), wait_chain(missing)));
    }
  }

  if (on_card) // read the others' buffers only after their streams have produced them
    for (int j = 0; j < n; ++j)
      if (j != index)
        slot->ready[j].block_current_stream();

  work(*slot, index);

  DeviceEvent done; // recorded before departing, under the lock others read it under
  if (on_card)
    done.record();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (on_card)
      slot->done[index] = std::move(done);
    if (++slot->departed == n) {
      slots_.erase({key, seq});
      cv_.notify_all();
    }
    // Others are still reading our input or writing our output until they depart.
    const bool all_done = cv_.wait_for(lock, timeout_, [&] {
      return slot->departed == n || !abort_reason_.empty();
    });
    if (!abort_reason_.empty() && slot->departed != n)
      throw RankAborted(abort_reason_);
    if (!all_done)
      throw CollectiveTimeout(
          fmt::format("{} #{} on group [{}]: members did not finish in time", op, seq, key));
  }
  if (on_card) // our buffers are ours again once every member's work on them has run
    for (int j = 0; j < n; ++j)
      if (j != index)
        slot->done[j].block_current_stream();
}

} // namespace meshsim
