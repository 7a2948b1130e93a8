#!/usr/bin/env bash
# Benchmark of `meshsim plan` at real scale (issue: real-size models without running them):
#   the 175B GPT of Narayanan et al. on 1,024 A100-80GB (tp 8, pp 8, dp 16, global batch 1536,
#   micro-batch 1, bf16, full recompute, ZeRO 1), wall time of the whole command.
# Target: under 5 s on a 2-core machine.
# Then `meshsim plan --search` over every layout of the same model, cluster and global batch.
# Target: under 60 s. Then the same over Llama 3 70B on 1,024 H100 at 32,768 tokens, with
# context parallelism in the space (target: under 60 s). The targets hold for a 2-core AVX2
# machine, about twice as slow as an AVX-512 one at this (docs/planning.md).
# Usage: bench/plan.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
# timed NAME ARGS: meshsim with ARGS (split into words), its JSON in /tmp/meshsim-NAME.json, its
# stderr in .err and its peak RSS in .rss; prints its wall seconds.
timed() {
  local start end
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "/tmp/meshsim-$1.rss" "$build/meshsim" $2 \
    >"/tmp/meshsim-$1.json" 2>"/tmp/meshsim-$1.err"
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}
args="plan --model gpt-175b --no-tie-head --cluster 128x8xa100-80 --tp 8 --pp 8 --zero 1
      --precision bf16 --global-batch-size 1536 --micro-batches 96 --recompute full --json"
seconds=$(timed plan "$args")
python3 - "$seconds" <<'PY'
import json, sys
seconds = float(sys.argv[1])
doc = json.load(open("/tmp/meshsim-plan.json"))
rss = int(open("/tmp/meshsim-plan.rss").read().split()[-1]) / 1024
print(f"(plan) gpt-175b on 1024 A100-80GB, tp 8 pp 8 dp 16: {seconds:.1f} s wall "
      f"(target < 5 s), {rss:.0f} MiB peak RSS; predicted step {doc['step_seconds']:.2f} s, "
      f"MFU {100 * doc['mfu']:.1f}%, fits {doc['fits']}")
PY
grep "ran \|replayed" /tmp/meshsim-plan.err | sed 's/^/  /'
search="plan --model gpt-175b --no-tie-head --cluster 128x8xa100-80 --precision bf16
        --global-batch-size 1536 --search --json"
seconds=$(timed search "$search")
python3 - "$seconds" <<'PY'
import json, sys
seconds = float(sys.argv[1])
doc = json.load(open("/tmp/meshsim-search.json"))
print(f"(plan --search) gpt-175b on 1024 A100-80GB, global batch 1536: {seconds:.1f} s wall "
      f"(target < 60 s); {doc['candidates']} layouts, {doc['invalid']} do not divide, "
      f"{doc['planned']} planned, {doc['fitting']} fit")
for l in doc["layouts"][:3]:
    y = l["layout"]
    print(f"  #{l['rank']}: tp {y['tp']} pp {y['pp']} dp {y['dp']} zero {y['zero']} "
          f"mbs {y['micro_batch_size']} recompute {y['recompute']} sp {y['sequence_parallel']}: "
          f"{l['step_seconds']:.2f} s/step, MFU {100 * l['mfu']:.1f}%, "
          f"peak {l['peak_bytes'] / 2**30:.1f} GiB" +
          (f" (planned in full; estimated {l['estimated_step_seconds']:.3f} s, "
           f"{100 * (l['estimated_step_seconds'] / l['step_seconds'] - 1):+.2f} %)"
           if l['planned_in_full'] else ""))
PY
search70="plan --search --preset llama3-70b --cluster 128x8xh100 --precision bf16 --seq-len 32768
          --global-batch-size 64 --json"
seconds=$(timed search70 "$search70")
python3 - "$seconds" <<'PY'
import json, sys
seconds = float(sys.argv[1])
doc = json.load(open("/tmp/meshsim-search70.json"))
print(f"(plan --search) llama3-70b on 1024 H100, 32K tokens, global batch 64: {seconds:.1f} s "
      f"wall (target < 60 s); {doc['candidates']} layouts, {doc['planned']} planned, "
      f"{doc['fitting']} fit, {doc.get('allgather_skipped', 0)} tp x cp x pp with the ring only")
y = doc["layouts"][0]["layout"]
print(f"  #1: tp {y['tp']} cp {y.get('cp', 1)} ({y.get('cp_comm', '')}) pp {y['pp']} dp {y['dp']} "
      f"zero {y['zero']} mbs {y['micro_batch_size']}: {doc['layouts'][0]['step_seconds']:.3f} s/step")
PY
