#!/usr/bin/env bash
# Benchmarks of the core issue, measured side by side in one run on this machine:
#   (a) meshsim ddp / meshsim single, same global batch (256) and steps (100), 8 GPUs
#   (b) meshsim ddp / PyTorch's own DDP (Gloo, 8 processes), same model, batch and steps
#   (c) in-process all-reduce of 64 MiB x 8 ranks / memcpy of 8 x 64 MiB
#   (d), (e), (f) c10d processes / virtual GPUs, and the saving of DDP's and ZeRO 2's overlap
#   (bench/processes.sh)
# Times are training-loop seconds (summary.json's train_seconds; the same span in the
# PyTorch script): no process start, data loading or evaluation. Run on a quiet machine.
set -euo pipefail
build=${1:-build}
steps=${STEPS:-100}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
py=/usr/bin/python3

common="train --data synthetic --synthetic-train 25600 --synthetic-test 256 --max-steps $steps --no-progress"
seconds() { $py -c "import json,sys; print(json.load(open(sys.argv[1]))['train_seconds'])" "$1/summary.json"; }

echo "meshsim benchmarks: CNN, global batch 256, $steps steps, $(nproc) cores"
"$build/meshsim" $common --gpus 8 --batch-size 32 --out "$out/ddp" >/dev/null 2>&1
"$build/meshsim" $common --strategy single --gpus 1 --batch-size 256 --out "$out/single" >/dev/null 2>&1
ddp=$(seconds "$out/ddp")
single=$(seconds "$out/single")
if $py -c 'import torch.distributed' 2>/dev/null; then
  torch_ddp=$($py "$(dirname "$0")/pytorch_ddp.py" --world 8 --steps "$steps" --global-batch 256 2>/dev/null | tail -1)
else
  torch_ddp=""
fi

$py - "$ddp" "$single" "$torch_ddp" <<'PY'
import sys
ddp, single, torch_ddp = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(f"  meshsim ddp (8 GPUs x 32)      {ddp:7.2f} s")
print(f"  meshsim single (1 GPU x 256)   {single:7.2f} s")
print(f"(a) ddp / single         = {ddp / single:.3f}  (target <= 1.10)")
if torch_ddp:
    t = float(torch_ddp)
    print(f"  PyTorch DDP (gloo, 8 procs)    {t:7.2f} s")
    print(f"(b) meshsim / PyTorch DDP = {ddp / t:.3f}  (target <= 0.75)")
else:
    print("(b) skipped: /usr/bin/python3 has no torch.distributed (install python3-torch)")
PY
"$build/bench_allreduce" 10
GPUS=2 bash "$(dirname "$0")/processes.sh" "$build"
GPUS=4 bash "$(dirname "$0")/processes.sh" "$build"
# Real-size planning, and the CUDA benchmarks (which say why they skip without a card).
bash "$(dirname "$0")/plan.sh" "$build"
bash "$(dirname "$0")/cuda.sh" "$build"
