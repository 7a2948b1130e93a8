// Tests for --memory-snapshot: the allocation history a virtual GPU keeps, the snapshot made
// of it (report/memory_snapshot.h), and the pickle Python reads it from (base/pickle.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "memory/allocator.h"
#include "mesh/device_mesh.h"
#include "report/memory_snapshot.h"
#include "base/pickle.h"
#include "../python_torch.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;

std::string run_python(const std::string& script, const fs::path& arg) {
  const auto out = fs::temp_directory_path() / ("meshsim-py-" + std::to_string(::getpid()));
  const std::string cmd = MESHSIM_PYTHON " " MESHSIM_SOURCE_DIR "/tests/report/" + script + " " +
                          arg.string() + " > " + out.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  fs::remove(out);
  return (rc == 0 ? "" : "exit " + std::to_string(rc) + ": ") + text;
}

MeshOptions two_gpus_keeping(int steps) {
  MeshOptions o;
  o.world_size = 2;
  o.capacity_bytes = 64 << 20;
  o.history_steps = steps;
  return o;
}

TEST(MemorySnapshot, LiveBlocksAreTheGpusBytesAndEventsNameCategoryAndPhase) {
  install_accounting_allocator();
  DeviceMesh mesh(two_gpus_keeping(3));
  torch::Tensor weights, activations;
  {
    GpuGuard on(&mesh.gpu(1));
    CategoryScope parameters(MemoryCategory::Parameters);
    weights = torch::zeros({1000}, torch::kFloat32);  // 4000 B
  }
  mesh.sample_memory(0, "model", 1);
  {
    GpuGuard on(&mesh.gpu(1));
    CategoryScope a(MemoryCategory::Activations);
    activations = torch::zeros({250}, torch::kFloat64);  // 2000 B
  }
  mesh.sample_memory(1, "forward", 1);
  activations = torch::Tensor();
  mesh.sample_memory(1, "backward", 1);

  const auto snap = memory_snapshot(*mesh.history(1), mesh.timeline().samples(), 1);
  // The end: the weights alone, one segment of one block, as PyTorch's viewers expect.
  ASSERT_EQ(snap["segments"].size(), 1u);
  const auto& seg = snap["segments"][0];
  EXPECT_EQ(seg["total_size"], 4000);
  EXPECT_EQ(seg["blocks"][0]["size"], 4000);
  EXPECT_EQ(seg["blocks"][0]["state"], "active_allocated");
  EXPECT_EQ(seg["frames"][0]["name"], "parameters");
  EXPECT_EQ(seg["frames"][1]["name"], "model");  // the phase that ended after it
  EXPECT_EQ(mesh.gpu(1).current_bytes(), 4000);

  // The trace: weights allocated, activations allocated in forward and freed in backward.
  const auto& trace = snap["device_traces"][0];
  std::vector<std::string> seen;
  for (const auto& e : trace)
    seen.push_back(e["action"].get<std::string>() + " " + std::to_string(e["size"].get<int64_t>()) +
                   " " + e["frames"][0]["name"].get<std::string>() + " " +
                   e["frames"][1]["name"].get<std::string>());
  EXPECT_EQ(seen, (std::vector<std::string>{"alloc 4000 parameters model",
                                             "alloc 2000 activations forward",
                                             "free_requested 2000 activations backward",
                                             "free_completed 2000 activations backward"}));
  // GPU 0 allocated nothing.
  EXPECT_TRUE(memory_snapshot(*mesh.history(0), mesh.timeline().samples(), 0)["device_traces"][0]
                  .empty());
}

TEST(MemorySnapshot, KeepsTheLastStepsOnly) {
  install_accounting_allocator();
  DeviceMesh mesh(two_gpus_keeping(2));
  for (int64_t step = 1; step <= 5; ++step) {
    {
      GpuGuard on(&mesh.gpu(0));
      CategoryScope a(MemoryCategory::Activations);
      torch::Tensor t = torch::zeros({static_cast<int64_t>(100 * step)}, torch::kUInt8);
      mesh.sample_memory(step, "forward", 0);
    }
    mesh.sample_memory(step, "backward", 0);
  }
  std::set<int64_t> sizes;
  for (const auto& e : mesh.history(0)->events()) sizes.insert(e.size);
  EXPECT_EQ(sizes, (std::set<int64_t>{400, 500}));  // steps 4 and 5
  EXPECT_EQ(mesh.history(1)->events().size(), 0u);
}

TEST(MemorySnapshot, WithoutTheFlagNoHistoryIsKept) {
  MeshOptions o = two_gpus_keeping(0);
  DeviceMesh mesh(o);
  EXPECT_EQ(mesh.history(0), nullptr);
  EXPECT_EQ(mesh.gpu(0).history(), nullptr);
}

TEST(Pickle, PythonReadsWhatWasWritten) {
  if (std::system(MESHSIM_PYTHON " -c pass >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no " MESHSIM_PYTHON;
  const nlohmann::json value = {
      {"small", -5},        {"int32", 2147483647}, {"big", int64_t{1} << 40},
      {"negative", -(int64_t{1} << 40)}, {"huge", uint64_t{18446744073709551610ull}},
      {"float", 0.1},       {"text", "gpu0 – ü"},  {"yes", true},
      {"no", false},        {"none", nullptr},     {"empty", nlohmann::json::array()},
      {"list", {1, "two", 3.5, {{"nested", nlohmann::json::object()}}}}};
  const auto file = fs::temp_directory_path() / ("meshsim-pickle-" + std::to_string(::getpid()));
  {
    std::ofstream f(file, std::ios::binary);
    f << to_pickle(value);
  }
  const std::string printed = run_python("read_pickle.py", file);
  fs::remove(file);
  EXPECT_EQ(nlohmann::json::parse(printed, nullptr, false), value) << printed;
}

// A real run's snapshots open in PyTorch's own viewer functions (python3-torch 1.13's
// torch.cuda._memory_viz, which read the segments' blocks and their history).
TEST(MemorySnapshot, PyTorchsViewerReadsARunsSnapshot) {
  if (!testing::python_torch_available())
    GTEST_SKIP() << meshsim::testing::no_python_torch();
  const auto out = fs::temp_directory_path() / ("meshsim-snapshot-" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string cmd = std::string("CUDA_VISIBLE_DEVICES= ") + MESHSIM_BINARY +
                          " train --data synthetic --synthetic-train 256 --synthetic-test 32 "
                          "--batch-size 16 --gpus 2 --max-steps 5 --memory-snapshot --no-progress"
                          " --out " + out.string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (int gpu = 0; gpu < 2; ++gpu) {
    const auto file = out / "memory_snapshot" / ("gpu" + std::to_string(gpu) + ".pickle");
    ASSERT_TRUE(fs::exists(file));
    const std::string printed = run_python("read_snapshot.py", file);
    const auto summary = nlohmann::json::parse(printed, nullptr, false);
    ASSERT_TRUE(summary.is_object()) << printed;
    // The viewer's own totals equal the blocks', and the blocks are the model state.
    EXPECT_EQ(summary["viewer_total"], summary["live_bytes"]) << printed;
    EXPECT_GT(summary["live_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(summary["segments"], summary["blocks"]);
    // The last steps' events: every category named is one of meshsim's, and the phases of a
    // DDP step are there.
    for (const auto& c : summary["categories"])
      EXPECT_TRUE(std::set<std::string>({"parameters", "gradients", "optimizer", "activations",
                                         "communication", "other"})
                      .count(c.get<std::string>()))
          << c;
    const auto phases = summary["phases"].get<std::set<std::string>>();
    for (const char* p : {"forward", "backward", "optimizer"})
      EXPECT_TRUE(phases.count(p)) << p << " in " << printed;
    EXPECT_GT(summary["allocs"].get<int64_t>(), 0);
    EXPECT_EQ(summary["steps"].get<std::vector<int64_t>>(), (std::vector<int64_t>{3, 4, 5}))
        << printed;
  }
  fs::remove_all(out);
}

} // namespace
} // namespace meshsim
