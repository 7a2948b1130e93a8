// `meshsim export RUN --state-dict FILE` loads in PyTorch 2.x with torch.load's defaults:
// since 2.6 torch.load unpickles with weights_only=True, which refuses every global it does not
// know, LibTorch's type tags for dicts (torch.jit._pickle.restore_type_tag) among them.
#include <gtest/gtest.h>

#include "../cli/process_harness.h"
#include "../python_torch.h"

using namespace meshsim::testing;
namespace fs = std::filesystem;

TEST(PyTorchExport, StateDictLoadsWithTorchLoadDefaults) {
  if (!python_torch2_available())
    GTEST_SKIP() << no_python_torch2();
  const fs::path run = fresh_dir("pytorch-export");
  const auto r = run_meshsim(
      "train --model llama --layers 1 --hidden 16 --heads 2 --seq-len 8 --vocab 32 --data "
      "synthetic --synthetic-train 16 --synthetic-test 4 --batch-size 4 --max-steps 1 --gpus 1 "
      "--strategy single --out " + run.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const fs::path file = run / "exported.pt";
  const auto e = run_meshsim_exactly("export " + run.string() + " --state-dict " + file.string());
  ASSERT_EQ(e.code, 0) << e.output;
  // The model's 12 tensors (embedding; per block 2 norms, q, k, v, o, gate, up, down; the
  // final norm and the head), in order, each a plain tensor.
  const auto load = run_command(
      MESHSIM_PYTHON " -c 'import sys, torch; d = torch.load(sys.argv[1]); "
      "print(type(d).__name__, len(d), list(d)[0], list(d)[-1], "
      "all(type(t) is torch.Tensor for t in d.values()))' " + file.string());
  ASSERT_EQ(load.code, 0) << load.output;
  EXPECT_EQ(load.output, "dict 12 embed.wte head.weight True\n");
}
