#!/usr/bin/env bash
# Benchmark of `meshsim plan` at real scale (issue: real-size models without running them):
#   the 175B GPT of Narayanan et al. on 1,024 A100-80GB (tp 8, pp 8, dp 16, global batch 1536,
#   micro-batch 1, bf16, full recompute, ZeRO 1), wall time of the whole command.
# Target: under 5 s on a 2-core machine. Usage: bench/plan.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
args="plan --model gpt-175b --no-tie-head --cluster 128x8xa100-80 --tp 8 --pp 8 --zero 1
      --precision bf16 --global-batch-size 1536 --micro-batches 96 --recompute full --json"
start=$(date +%s.%N)
/usr/bin/time -f "%M" -o /tmp/meshsim-plan-rss "$build/meshsim" $args >/tmp/meshsim-plan.json 2>/tmp/meshsim-plan.err
end=$(date +%s.%N)
python3 - "$start" "$end" <<'PY'
import json, sys
start, end = map(float, sys.argv[1:3])
doc = json.load(open("/tmp/meshsim-plan.json"))
rss = int(open("/tmp/meshsim-plan-rss").read().split()[-1]) / 1024
print(f"(plan) gpt-175b on 1024 A100-80GB, tp 8 pp 8 dp 16: {end - start:.1f} s wall "
      f"(target < 5 s), {rss:.0f} MiB peak RSS; predicted step {doc['step_seconds']:.2f} s, "
      f"MFU {100 * doc['mfu']:.1f}%, fits {doc['fits']}")
PY
grep "ran \|replayed" /tmp/meshsim-plan.err | sed 's/^/  /'
echo "(plan --search) not built yet"
