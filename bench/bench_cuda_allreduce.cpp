// Benchmark (CUDA b): the in-process all-reduce of 256 MiB per rank over 8 virtual GPUs on one
// card, against the least memory traffic any all-reduce can do there: a device-to-device
// copy of 8 x 256 MiB (every input read once, every output written once). Side by side in one
// run; prints the ratio and nccl-tests' algbw/busbw. Skips, saying why, without a card.
#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "memory/cuda_allocator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

using namespace meshsim;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  const CudaStatus card = cuda_status();
  if (!card.usable) {
    fmt::print("(CUDA b) skipped: {}\n", card.reason);
    return 0;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  constexpr int kRanks = 8;
  constexpr int64_t kBytes = int64_t{256} << 20;
  constexpr int64_t kNumel = kBytes / 4;

  MeshOptions m;
  m.world_size = kRanks;
  m.capacity_bytes = int64_t{2} << 30;
  m.device = "cuda";
  DeviceMesh mesh(m);
  std::vector<double> allreduce;
  bool correct = true;
  run_ranks(mesh, [&](RankContext& ctx) {
    torch::Tensor t = torch::empty({kNumel}, torch::TensorOptions().device(torch::kCUDA, 0));
    for (int rep = 0; rep <= reps; ++rep) {
      t.fill_(static_cast<float>(ctx.rank + 1));
      mesh.stream(ctx.rank).synchronize();
      ctx.comm.barrier();
      const auto start = Clock::now();
      ctx.comm.all_reduce(t, ReduceOp::Sum);
      mesh.stream(ctx.rank).synchronize();
      ctx.comm.barrier();
      if (ctx.rank == 0 && rep > 0) // the first is a warm-up
        allreduce.push_back(seconds_since(start));
    }
    const float expected = kRanks * (kRanks + 1) / 2.0f;
    if (t.min().item<float>() != expected || t.max().item<float>() != expected)
      correct = false;
  });

  // The same bytes moved by plain copies on one stream.
  std::vector<torch::Tensor> src, dst;
  for (int r = 0; r < kRanks; ++r) {
    src.push_back(torch::ones({kNumel}, torch::kCUDA));
    dst.push_back(torch::empty({kNumel}, torch::kCUDA));
  }
  std::vector<double> copy;
  for (int rep = 0; rep <= reps; ++rep) {
    cuda_synchronize();
    const auto start = Clock::now();
    for (int r = 0; r < kRanks; ++r)
      dst[r].copy_(src[r]);
    cuda_synchronize();
    if (rep > 0)
      copy.push_back(seconds_since(start));
  }

  const double a = median(allreduce), c = median(copy);
  const double algbw = kBytes / a / 1e9, busbw = algbw * 2.0 * (kRanks - 1) / kRanks;
  fmt::print("(CUDA b) on {}: all-reduce of 256 MiB x {} virtual GPUs {:.3f} ms (median of {}), "
             "result {}; device-to-device copy of {} x 256 MiB {:.3f} ms ({:.0f} GB/s read+write)\n",
             card.name, kRanks, a * 1e3, reps, correct ? "correct" : "WRONG", kRanks, c * 1e3,
             2.0 * kRanks * kBytes / c / 1e9);
  fmt::print("(CUDA b) all-reduce / copy = {:.3f}  (target <= 1.3); algbw {:.0f} GB/s, busbw "
             "{:.0f} GB/s\n",
             a / c, algbw, busbw);
  return correct ? 0 : 1;
}
