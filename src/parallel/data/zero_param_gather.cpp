// The distributed optimizer's parameter gathers (ZeroOptions::distributed_optimizer), as
// Megatron-Core's --overlap-param-gather runs them: the optimizer step leaves every unit's full
// parameters behind its updated shard ("stale"), and the next step brings them up to date.
// zero_grad() at the step's start launches every unit's all-gather at once, in forward order
// (Megatron's --align-param-gather, its default, launches a model chunk's at the schedule's
// start on every pipeline stage alike); each child of the model with parameters is wrapped so
// that its forward first waits for its units' gathers. A forward outside a step (evaluation)
// finds none started: each child starts its own and the next child's, which then runs while
// it computes. The gathers are in place: a member's shard is its own slot of `full`.
#include <algorithm>
#include <functional>
#include <unordered_map>

#include <torch/torch.h>

#include "parallel/data/zero_state.h"

namespace meshsim {
namespace {

class GatheringChildImpl : public ZeroWrapper {
public:
  GatheringChildImpl(torch::nn::AnyModule inner, std::function<void()> before)
      : ZeroWrapper(std::move(inner)), before_(std::move(before)) {}

  torch::Tensor forward(torch::Tensor x) {
    before_();
    return inner_.forward(x);
  }

private:
  std::function<void()> before_;
};
TORCH_MODULE(GatheringChild);

} // namespace

void ZeroDataParallel::State::start_param_gather(FlatUnit& unit) {
  if (!stale.count(&unit) || param_gathers.count(&unit))
    return;
  torch::NoGradGuard no_grad;
  param_gathers.emplace(&unit, ctx.comm.all_gather_async(
                                   unit.shard, unit.full.view({unit.group.size(), -1}), unit.group));
}

void ZeroDataParallel::State::finish_param_gather(FlatUnit& unit) {
  if (!stale.count(&unit))
    return;
  start_param_gather(unit);
  const auto it = param_gathers.find(&unit);
  const std::unique_ptr<Work> work = std::move(it->second);
  param_gathers.erase(it);
  work->wait();
  stale.erase(&unit);
  ctx.sample_memory(step, "all_gather");
}

void ZeroDataParallel::State::finish_param_gathers() {
  // Every step and every read of the full parameters comes here.
  if (stale.empty() && param_gathers.empty())
    return;
  for (auto it = units.rbegin(); it != units.rend(); ++it) { // forward order
    finish_param_gather(**it);
    if (options.stage == 3 && param_gathers.count(it->get())) // a prefetch nothing waited for
      gather(**it);
  }
}

void ZeroDataParallel::State::mark_parameters_stale() {
  for (auto& unit : units)
    stale.insert(unit.get());
}

void ZeroDataParallel::State::start_param_gathers() {
  for (auto it = units.rbegin(); it != units.rend(); ++it) // forward order
    start_param_gather(**it);
}

torch::nn::Sequential ZeroDataParallel::State::wrap_for_param_gathers() {
  std::unordered_map<const void*, FlatUnit*> unit_of;
  for (auto& unit : units)
    for (const auto& p : unit->params)
      unit_of.emplace(p.unsafeGetTensorImpl(), unit.get());
  // Each child's units, in the order its parameters come.
  std::vector<std::vector<FlatUnit*>> units_of(model->size());
  for (size_t c = 0; c < model->size(); ++c)
    for (const auto& p : model->ptr(c)->parameters()) {
      FlatUnit* unit = unit_of.at(p.unsafeGetTensorImpl());
      auto& mine = units_of[c];
      if (std::find(mine.begin(), mine.end(), unit) == mine.end())
        mine.push_back(unit);
    }
  torch::nn::Sequential wrapped;
  const auto names = model->named_children();
  size_t c = 0;
  for (const auto& any : *model) {
    const std::string& name = names[c].key();
    std::vector<FlatUnit*> mine = units_of[c], next;
    for (size_t later = c + 1; later < model->size() && next.empty(); ++later)
      for (FlatUnit* unit : units_of[later])
        if (std::find(mine.begin(), mine.end(), unit) == mine.end())
          next.push_back(unit);
    ++c;
    if (mine.empty()) {
      wrapped->push_back(name, torch::nn::AnyModule(any));
      continue;
    }
    wrapped->push_back(name, torch::nn::AnyModule(GatheringChild(any, [this, mine, next] {
                         for (FlatUnit* unit : mine) finish_param_gather(*unit);
                         for (FlatUnit* unit : next) start_param_gather(*unit);
                       })));
  }
  return wrapped;
}

} // namespace meshsim
