#!/usr/bin/env bash
# Benchmarks of processes and overlap (docs/processes.md), measured side by side in one run:
#   (d) the same DDP run on 4 processes through c10d (Gloo) / on 4 virtual GPUs (sim)
#   (e) sim with DDP's bucket all-reduces overlapped with backward / without (--no-overlap)
#   (f) sim with ZeRO 2's reduce-scatters overlapped with backward / without (--no-overlap)
# The CNN with 0.25 MiB buckets (7 per step, so there is something to overlap), global batch
# 128 over $GPUS GPUs (4), $STEPS steps. Times are training-loop seconds (summary.json's train_seconds), the
# median of $REPEATS runs each, the runs of the two sides interleaved.
set -euo pipefail
build=${1:-build}
steps=${STEPS:-60}
gpus=${GPUS:-4}
repeats=${REPEATS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
py=/usr/bin/python3
port=$(( 29700 + RANDOM % 200 ))

common="train --data synthetic --synthetic-train 8192 --synthetic-test 128 --max-steps $steps --gpus $gpus --batch-size $((128 / gpus)) --bucket-mb 0.25 --no-progress"
seconds() { $py -c "import json,sys; print(json.load(open(sys.argv[1]))['train_seconds'])" "$1/summary.json"; }

c10d=() sim=() serial=() zero=() zero_serial=()
for i in $(seq "$repeats"); do
  "$build/meshsim" launch --nproc-per-node $gpus --master-port $((port + i)) -- $common --backend c10d --out "$out/c10d$i" >/dev/null 2>&1
  "$build/meshsim" $common --out "$out/sim$i" >/dev/null 2>&1
  "$build/meshsim" $common --no-overlap --out "$out/serial$i" >/dev/null 2>&1
  "$build/meshsim" $common --zero 2 --out "$out/zero$i" >/dev/null 2>&1
  "$build/meshsim" $common --zero 2 --no-overlap --out "$out/zero_serial$i" >/dev/null 2>&1
  c10d+=("$(seconds "$out/c10d$i")") sim+=("$(seconds "$out/sim$i")") serial+=("$(seconds "$out/serial$i")")
  zero+=("$(seconds "$out/zero$i")") zero_serial+=("$(seconds "$out/zero_serial$i")")
done

$py - "${c10d[*]}" "${sim[*]}" "${serial[*]}" "${zero[*]}" "${zero_serial[*]}" "$steps" "$gpus" <<'PY'
import statistics, sys
c10d, sim, serial, zero, zero_serial = ([float(x) for x in a.split()] for a in sys.argv[1:6])
steps, gpus = int(sys.argv[6]), int(sys.argv[7])
c, s, n = statistics.median(c10d), statistics.median(sim), statistics.median(serial)
z, zn = statistics.median(zero), statistics.median(zero_serial)
print(f"processes and overlap: CNN, DDP on {gpus} GPUs, global batch 128, 0.25 MiB buckets, {steps} steps, median of {len(sim)}")
print(f"  c10d (Gloo, {gpus} processes)       {c:7.2f} s   runs {' '.join(f'{x:.2f}' for x in c10d)}")
print(f"  sim ({gpus} virtual GPUs)           {s:7.2f} s   runs {' '.join(f'{x:.2f}' for x in sim)}")
print(f"  sim --no-overlap               {n:7.2f} s   runs {' '.join(f'{x:.2f}' for x in serial)}")
print(f"  sim --zero 2                   {z:7.2f} s   runs {' '.join(f'{x:.2f}' for x in zero)}")
print(f"  sim --zero 2 --no-overlap      {zn:7.2f} s   runs {' '.join(f'{x:.2f}' for x in zero_serial)}")
print(f"(d) c10d / sim           = {c / s:.3f}")
print(f"(e) overlap saves        = {n - s:.2f} s ({1000 * (n - s) / steps:.1f} ms per step, {100 * (n - s) / n:.1f} % of the step); with / without = {s / n:.3f}")
print(f"(f) zero 2 overlap saves = {zn - z:.2f} s ({100 * (zn - z) / zn:.1f} % of the step); with / without = {z / zn:.3f}")
PY
