// Rank threads, failure propagation and the choice of the "primary" error.
#include "mesh/rank_runner.h"

#include <ATen/Parallel.h>

#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "memory/allocator.h"

namespace meshsim {

void RankContext::record_compute(const std::string& name, int64_t step, const Mark& start) {
  ComputeRecord record;
  record.name = name;
  record.step = step;
  record.start_s = start.s;
  record.start_charges = start.charges;
  record.end_s = now();
  record.end_charges = thread_charge_count();
  recorder.compute.push_back(std::move(record));
}

int threads_per_rank(int world_size) {
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, world_size));
}

int threads_per_local_rank(const DeviceMesh& mesh) {
  return threads_per_rank(static_cast<int>(mesh.local_ranks().size()) * mesh.processes_per_host());
}

std::vector<Recorder> run_ranks(DeviceMesh& mesh, const std::function<void(RankContext&)>& fn) {
  return run_ranks(mesh, fn, mesh.local_ranks());
}

std::vector<Recorder> run_ranks(DeviceMesh& mesh, const std::function<void(RankContext&)>& fn,
                                const std::vector<int>& only) {
  install_accounting_allocator();
  const int n = mesh.world_size();
  std::vector<Recorder> recorders(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::unique_ptr<Communicator>> comms(n);
  for (int r : only) {
    if (r < 0 || r >= n || comms[r])
      throw std::invalid_argument(fmt::format("run_ranks: rank {} is out of range or repeated", r));
    comms[r] = mesh.make_communicator(r);
  }

  const int intra_threads = threads_per_local_rank(mesh); // `only` is a subset on meta alone
  std::vector<std::thread> threads;
  for (int r : only) {
    threads.emplace_back([&, r] {
      try {
        // Meta tensors compute nothing; resizing ATen's pool would only start idle threads.
        if (mesh.device() != "meta")
          at::set_num_threads(intra_threads);
        GpuGuard guard(&mesh.gpu(r));
        RankDeviceScope device(mesh.stream(r)); // on a card: its stream, its own backward
        RankContext ctx{r, n, mesh.gpu(r), *comms[r], recorders[r], mesh};
        fn(ctx);
      } catch (const RankLeft& e) {
        fmt::print(stderr, "meshsim: {}\n", e.what());
      } catch (const c10::OutOfMemoryError& e) { // the card's allocator ran out for this GPU
        mesh.gpu(r).device_out_of_memory(e.what());
        errors[r] = std::current_exception();
        mesh.comm_world().abort(fmt::format("rank {} failed: {}", r, mesh.gpu(r).oom_message()));
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        mesh.comm_world().abort(fmt::format("rank {} failed: {}", r, e.what()));
      } catch (...) {
        errors[r] = std::current_exception();
        mesh.comm_world().abort(fmt::format("rank {} failed", r));
      }
    });
  }
  for (auto& t : threads) t.join();

  for (int r : only) {
    const auto& records = comms[r]->records();
    recorders[r].collectives.assign(records.begin(), records.end());
  }

  // A GPU that ran out of memory is the cause, whatever exception type reached the thread
  // (autograd may wrap it).
  for (int r = 0; r < n; ++r)
    if (auto msg = mesh.gpu(r).oom_message(); !msg.empty()) throw OutOfMemory(msg);
  std::exception_ptr secondary;
  for (int r = 0; r < n; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const RankAborted&) {
      if (!secondary) secondary = errors[r];
    } catch (...) {
      throw;
    }
  }
  if (secondary) std::rethrow_exception(secondary);
  return recorders;
}

} // namespace meshsim
