// Group, an ordered set of global ranks, and the buffers every backend allocates alike.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/communicator.h"
#include "memory/allocator.h"

namespace meshsim {

int Group::index_of(int rank) const {
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank) return static_cast<int>(i);
  return -1;
}

std::string Group::key() const { return fmt::format("{}", fmt::join(ranks, ",")); }

Group Group::world(int n) {
  Group g;
  for (int r = 0; r < n; ++r) g.ranks.push_back(r);
  return g;
}

torch::Tensor all_gather_output(const torch::Tensor& input, int members) {
  std::vector<int64_t> sizes{members};
  for (auto d : input.sizes())
    sizes.push_back(d);
  CategoryScope scope(MemoryCategory::Communication);
  return torch::empty(sizes, input.options());
}

torch::Tensor reduce_scatter_output(const torch::Tensor& input, int members) {
  if (members < 1 || input.numel() % members != 0)
    throw std::invalid_argument(
        fmt::format("reduce_scatter: {} elements do not split evenly over {} ranks",
                    input.numel(), members));
  CategoryScope scope(MemoryCategory::Communication);
  return torch::empty({input.numel() / members}, input.options());
}

} // namespace meshsim
