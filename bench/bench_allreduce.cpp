// Benchmark (c): the in-process all-reduce of 64 MiB per rank over 8 ranks, against the
// least memory traffic any in-process all-reduce can do: reading every input once and
// writing every output once, i.e. memcpy of 8 x 64 MiB. Both are measured side by side,
// with as many threads as cores for the copy. Prints the ratio and nccl-tests' algbw/busbw.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "mesh/device_mesh.h"
#include "mesh/rank_runner.h"

using namespace meshsim;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// memcpy of `ranks` buffers of `bytes`, split over `threads` threads; best of `reps`.
double memcpy_time(int ranks, int64_t bytes, int threads, int reps) {
  std::vector<std::vector<char>> src(ranks, std::vector<char>(bytes, 1)), dst(ranks, std::vector<char>(bytes, 0));
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t = Clock::now();
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w)
      pool.emplace_back([&, w] {
        for (int r = w; r < ranks; r += threads) std::memcpy(dst[r].data(), src[r].data(), bytes);
      });
    for (auto& th : pool) th.join();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

} // namespace

int main(int argc, char** argv) {
  const int ranks = 8;
  const int64_t bytes = int64_t{64} << 20;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int cores = std::max(1u, std::thread::hardware_concurrency());

  MeshOptions options;
  options.world_size = ranks;
  options.capacity_bytes = int64_t{1} << 30;
  DeviceMesh mesh(options);
  std::vector<double> times;  // written by rank 0 only
  run_ranks(mesh, [&](RankContext& ctx) {
    auto t = torch::full({bytes / 4}, float(ctx.rank + 1));
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up (first-touch page faults)
      ctx.comm.barrier();
      const auto start = Clock::now();
      ctx.comm.all_reduce(t, ReduceOp::Sum);
      ctx.comm.barrier();  // the collective ends when the last rank is done
      if (ctx.rank == 0 && rep > 0) times.push_back(seconds_since(start));
    }
    // In place, reps+1 times: 36 after the first, then x8 each time; exact in float.
    const float expected = 36.0f * std::pow(8.0f, static_cast<float>(reps));
    if (!torch::equal(t, torch::full_like(t, expected)))
      throw std::runtime_error("all_reduce gave a wrong result");
  });
  std::sort(times.begin(), times.end());
  const double allreduce = times.front();
  const double median = times[times.size() / 2];
  const double copy_1 = memcpy_time(ranks, bytes, 1, reps);
  const double copy_n = memcpy_time(ranks, bytes, cores, reps);
  const double copy = std::min(copy_1, copy_n);

  const double algbw = bytes / allreduce / 1e9;
  const double busbw = algbw * 2.0 * (ranks - 1) / ranks;
  fmt::print("all_reduce 64 MiB x {} ranks (in-process, sum, float32), best of {}\n", ranks, reps);
  fmt::print("  all_reduce time        {:8.2f} ms (median {:.2f} ms)\n", allreduce * 1e3, median * 1e3);
  fmt::print("  memcpy 8 x 64 MiB      {:8.2f} ms (1 thread {:.2f} ms, {} threads {:.2f} ms)\n",
             copy * 1e3, copy_1 * 1e3, cores, copy_n * 1e3);
  fmt::print("  algbw {:.2f} GB/s  busbw {:.2f} GB/s  (nccl-tests: busbw = algbw * 2(n-1)/n)\n", algbw, busbw);
  fmt::print("(c) all_reduce / memcpy = {:.3f}  (target <= 1.25)\n", allreduce / copy);
  return 0;
}
