// ZeroDataParallel's state read from outside a step: the full parameters (gathered for a
// checkpoint's model, for tests, or around tensor parallel's own gather), and the parts of
// given parameters in this member's gradient shard (the mesh engine sums sequence
// parallelism's partial gradients over tp there). docs/zero.md.
#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "parallel/data/zero.h"
#include "parallel/data/zero_flat.h"
#include "parallel/data/zero_state.h"

namespace meshsim {

std::vector<torch::Tensor> ZeroDataParallel::full_parameters() {
  State& s = *state_;
  s.finish_param_gathers(); // the distributed optimizer's updated parameters
  torch::NoGradGuard no_grad;
  std::unordered_map<const void*, torch::Tensor> copies;
  for (auto& unit : s.units) {
    const bool was_materialized = unit->materialized;
    gather_full(*unit, s.ctx.comm, unit->group);
    for (const auto& p : unit->params)
      copies[p.unsafeGetTensorImpl()] = p.detach().clone();
    if (!was_materialized)
      release_full(*unit);
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : s.params)
    out.push_back(copies.at(p.unsafeGetTensorImpl()));
  return out;
}

void ZeroDataParallel::with_full_parameters(const std::function<void()>& read) {
  State& s = *state_;
  s.finish_param_gathers(); // the distributed optimizer's updated parameters
  std::vector<FlatUnit*> gathered;
  for (auto& unit : s.units)
    if (!unit->materialized) {
      gather_full(*unit, s.ctx.comm, unit->group);
      gathered.push_back(unit.get());
    }
  read();
  for (FlatUnit* unit : gathered)
    release_full(*unit);
}

std::vector<torch::Tensor>
ZeroDataParallel::shard_gradients_of(const std::vector<torch::Tensor>& params) {
  State& s = *state_;
  if (s.options.stage < 2)
    throw std::invalid_argument("zero: stages 0 and 1 keep whole gradients in .grad");
  std::unordered_map<const void*, std::pair<const FlatUnit*, size_t>> where;
  for (const auto& unit : s.units)
    for (size_t i = 0; i < unit->params.size(); ++i)
      where.emplace(unit->params[i].unsafeGetTensorImpl(), std::make_pair(unit.get(), i));
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    const auto it = where.find(p.unsafeGetTensorImpl());
    if (it == where.end())
      throw std::invalid_argument("zero: shard_gradients_of a tensor that is no parameter");
    const FlatUnit& unit = *it->second.first;
    // The parameter's elements [begin, end) of the flat buffer, and this member's shard's.
    const int64_t begin = unit.offsets[it->second.second], end = begin + p.numel();
    const int64_t lo = unit.member * unit.shard_numel, hi = lo + unit.shard_numel;
    const int64_t from = std::min(std::max(begin, lo), hi);
    const int64_t to = std::max(from, std::min(end, hi));
    out.push_back(unit.shard_grad.narrow(0, from - lo, to - from));
  }
  return out;
}

} // namespace meshsim
