// Evaluation with the same number of batches on every rank.
#include "train/evaluate.h"

#include <algorithm>

#include "memory/allocator.h"

namespace meshsim {

Evaluation evaluate(RankContext& ctx, Strategy& strategy, DataShard shard, const Dataset& test,
                    int64_t limit, int64_t batch_size) {
  const MemoryStats training = ctx.gpu.stats();
  ctx.gpu.reset_peaks();
  CategoryScope scope(MemoryCategory::Activations);
  // No-grad rather than inference mode: tensors made in inference mode cannot meet the
  // version-counted parameters that tensor-parallel and ZeRO layers use.
  torch::NoGradGuard no_grad;
  const int64_t n = limit > 0 ? std::min(limit, test.size()) : test.size();
  std::vector<int64_t> mine;
  for (int64_t i = shard.index; i < n; i += shard.replicas)
    mine.push_back(i);
  // Shard 0 has the most samples: ceil(n / replicas).
  const int64_t most = (n + shard.replicas - 1) / shard.replicas;
  const int64_t calls = std::max<int64_t>(1, (most + batch_size - 1) / batch_size);
  int64_t correct = 0, counted = 0;
  for (int64_t k = 0; k < calls; ++k) {
    const size_t start = static_cast<size_t>(k * batch_size);
    const bool real = start < mine.size();
    std::vector<int64_t> rows;
    if (real)
      rows.assign(mine.begin() + start, mine.begin() + std::min(mine.size(), start + batch_size));
    else
      rows = {0}; // a stand-in: runs the same collectives, counts nothing
    Batch b;
    std::tie(b.inputs, b.targets) = gather_batch(test, rows);
    if (ctx.mesh.on_card())
      b = b.to(torch::Device(torch::kCUDA, 0));
    const auto [c, m] = strategy.evaluate(b);
    if (!real)
      continue;
    correct += c;
    counted += m;
  }
  torch::Tensor counts;
  {
    CategoryScope comm_scope(MemoryCategory::Communication);
    counts = torch::tensor({correct, counted}, torch::kInt64);
    ctx.comm.all_reduce(counts, ReduceOp::Sum);
  }
  const auto* c = counts.data_ptr<int64_t>();
  Evaluation out;
  out.samples = c[1];
  out.accuracy = c[1] > 0 ? static_cast<double>(c[0]) / static_cast<double>(c[1]) : 0.0;
  counts = torch::Tensor();
  out.peak_bytes = ctx.gpu.peak_bytes();
  ctx.gpu.restore_peaks(training);
  return out;
}

} // namespace meshsim
