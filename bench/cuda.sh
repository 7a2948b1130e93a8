#!/usr/bin/env bash
# Benchmarks of the CUDA path, measured side by side in one run on the card (skipped, saying
# why, where there is none):
#   (a) meshsim ddp / meshsim single wall time at the same global batch and steps:
#       the CNN (8 virtual GPUs x 32 vs 1 x 256) and GPT-2 124M at sequence 1024 (4 x 2 vs 1 x 8)
#   (b) in-process all-reduce of 256 MiB x 8 virtual GPUs / device-to-device copy of 8 x 256 MiB
#   (c) meshsim ddp on 4 virtual GPUs / PyTorch's DDP on the same card (Gloo over CUDA tensors,
#       4 processes; NCCL refuses two ranks on one GPU), same CNN, batch and steps
# Times are training-loop seconds (summary.json's train_seconds; the same span in the PyTorch
# script). Usage: bench/cuda.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
steps=${STEPS:-100}
py=${PYTHON:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if ! "$build/meshsim" info | grep -q "^GPU: NVIDIA\|^GPU: [^n]"; then
  echo "CUDA benchmarks skipped: $("$build/meshsim" info | grep '^GPU:')"
  exit 0
fi
"$build/meshsim" info | grep "^GPU:"
seconds() { $py -c "import json,sys; print(json.load(open(sys.argv[1]))['train_seconds'])" "$1/summary.json"; }
run() { "$build/meshsim" train --device cuda --data synthetic --no-progress "$@" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }; }

cnn="--synthetic-train 25600 --synthetic-test 256 --max-steps $steps"
run $cnn --gpus 8 --batch-size 32 --out "$out/cnn_ddp"
run $cnn --strategy single --gpus 1 --batch-size 256 --out "$out/cnn_single"
gsteps=${GPT_STEPS:-20}
gpt="--model gpt2 --seq-len 1024 --synthetic-train 2048 --synthetic-test 8 --max-steps $gsteps --eval-limit 8"
run $gpt --gpus 4 --batch-size 2 --out "$out/gpt_ddp"
run $gpt --strategy single --gpus 1 --batch-size 8 --out "$out/gpt_single"
run $cnn --gpus 4 --batch-size 64 --out "$out/cnn_ddp4"
torch_ddp=$($py "$(dirname "$0")/pytorch_ddp.py" --device cuda --world 4 --steps "$steps" --global-batch 256 2>/dev/null | tail -1)

$py - "$(seconds $out/cnn_ddp)" "$(seconds $out/cnn_single)" "$(seconds $out/gpt_ddp)" \
  "$(seconds $out/gpt_single)" "$(seconds $out/cnn_ddp4)" "$torch_ddp" "$steps" "$gsteps" <<'PY'
import sys
cd, cs, gd, gs, c4, t4, steps, gsteps = sys.argv[1:]
cd, cs, gd, gs, c4, t4 = map(float, (cd, cs, gd, gs, c4, t4))
print(f"(CUDA a) CNN, global batch 256, {steps} steps: ddp 8 x 32 {cd:.2f} s, single 1 x 256 {cs:.2f} s: "
      f"ddp / single = {cd / cs:.3f} (target <= 1.10)")
print(f"(CUDA a) GPT-2 124M, sequence 1024, global batch 8, {gsteps} steps: ddp 4 x 2 {gd:.2f} s, "
      f"single 1 x 8 {gs:.2f} s: ddp / single = {gd / gs:.3f} (target <= 1.10)")
print(f"(CUDA c) CNN, 4 x 64, {steps} steps: meshsim ddp {c4:.2f} s, PyTorch DDP (gloo, 4 processes "
      f"on the card) {t4:.2f} s: meshsim / PyTorch = {c4 / t4:.3f}")
PY
"$build/bench_cuda_allreduce" 20
