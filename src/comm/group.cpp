// Group, an ordered set of global ranks, and what every backend computes alike: the buffers
// it allocates, all_to_all's splits.
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

void check_all_gather_output(const torch::Tensor& input, const torch::Tensor& output,
                             int members) {
  if (output.numel() != input.numel() * members || output.scalar_type() != input.scalar_type())
    throw std::invalid_argument(
        fmt::format("all_gather: an output of {} {} elements for {} {} over {} ranks",
                    output.numel(), c10::toString(output.scalar_type()), input.numel(),
                    c10::toString(input.scalar_type()), members));
}

torch::Tensor reduce_scatter_output(const torch::Tensor& input, int members) {
  if (members < 1 || input.numel() % members != 0)
    throw std::invalid_argument(
        fmt::format("reduce_scatter: {} elements do not split evenly over {} ranks",
                    input.numel(), members));
  CategoryScope scope(MemoryCategory::Communication);
  return torch::empty({input.numel() / members}, input.options());
}

int64_t AllToAllSplits::output_rows() const {
  int64_t rows = 0;
  for (int64_t r : output)
    rows += r;
  return rows;
}

namespace {

// `given` checked, or `rows` split evenly over `members` when it is empty.
std::vector<int64_t> resolve_splits(const std::vector<int64_t>& given, int64_t rows, int members,
                                    const char* which) {
  if (given.empty()) {
    if (rows % members != 0)
      throw std::invalid_argument(fmt::format(
          "all_to_all: {} rows do not split evenly over {} ranks (give {} split sizes)", rows,
          members, which));
    return std::vector<int64_t>(static_cast<size_t>(members), rows / members);
  }
  if (static_cast<int>(given.size()) != members)
    throw std::invalid_argument(fmt::format("all_to_all: {} {} split sizes for a group of {}",
                                            given.size(), which, members));
  for (int64_t r : given)
    if (r < 0)
      throw std::invalid_argument(
          fmt::format("all_to_all: negative {} split size {}", which, r));
  return given;
}

} // namespace

AllToAllSplits all_to_all_splits(const torch::Tensor& input,
                                 const std::vector<int64_t>& output_split_sizes,
                                 const std::vector<int64_t>& input_split_sizes, int members) {
  if (members < 1)
    throw std::invalid_argument("all_to_all: an empty group");
  if (input.dim() < 1)
    throw std::invalid_argument("all_to_all: the input needs a dimension to split (dim 0)");
  const int64_t rows = input.size(0);
  AllToAllSplits s;
  s.input = resolve_splits(input_split_sizes, rows, members, "input");
  s.output = resolve_splits(output_split_sizes, rows, members, "output");
  int64_t sent = 0;
  for (int64_t r : s.input)
    sent += r;
  if (sent != rows)
    throw std::invalid_argument(fmt::format(
        "all_to_all: input split sizes add up to {} rows, the input has {}", sent, rows));
  s.row_numel = 1;
  for (int64_t d = 1; d < input.dim(); ++d)
    s.row_numel *= input.size(d);
  return s;
}

torch::Tensor all_to_all_output(const torch::Tensor& input, const AllToAllSplits& splits) {
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] = splits.output_rows();
  CategoryScope scope(MemoryCategory::Communication);
  return torch::empty(sizes, input.options());
}

std::vector<int64_t> all_to_all_peer_bytes(const torch::Tensor& input,
                                           const AllToAllSplits& splits) {
  const int64_t row_bytes = splits.row_numel * static_cast<int64_t>(input.element_size());
  std::vector<int64_t> bytes;
  for (int64_t r : splits.input)
    bytes.push_back(r * row_bytes);
  return bytes;
}

void Communicator::check_irecv_fits(const torch::Tensor& output, const torch::Tensor& got,
                                    int src) {
  if (got.scalar_type() != output.scalar_type() || got.numel() != output.numel())
    throw std::invalid_argument(fmt::format(
        "irecv: the message from rank {} is {} {} elements, the output {} {} elements", src,
        got.numel(), c10::toString(got.scalar_type()), output.numel(),
        c10::toString(output.scalar_type())));
}

} // namespace meshsim
