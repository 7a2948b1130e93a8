#!/usr/bin/env bash
# Draws docs/images/pipeline-stage-peaks.png: per pipeline stage, the training peak of a
# 1F1B run and of a GPipe run, and the evaluation peak, from their summary.json files.
# Usage: plot_stage_peaks.sh RUN_1F1B RUN_GPIPE OUT.png
set -euo pipefail
data=$(mktemp)
trap 'rm -f "$data"' EXIT
python3 - "$1/summary.json" "$2/summary.json" >"$data" <<'PY'
import json, sys
a, b = (json.load(open(p))["gpus"] for p in sys.argv[1:3])
for x, y in zip(a, b):
    mib = lambda v: v / 2**20
    print(f'"stage {x["rank"]}" {mib(x["peak_bytes"]):.2f} {mib(y["peak_bytes"]):.2f} {mib(x["eval_peak_bytes"]):.2f}')
PY
gnuplot <<GP
set terminal pngcairo size 900,480 font ",11" noenhanced
set output "$3"
set title "Peak memory per pipeline stage (CNN, 4 stages, 8 micro-batches of 8)"
set ylabel "MiB"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set key top right
set grid ytics
plot "$data" using 2:xtic(1) title "training, 1f1b" lc rgb "#1b9e77", \
     "" using 3 title "training, gpipe" lc rgb "#d95f02", \
     "" using 4 title "evaluation (eval_peak_bytes)" lc rgb "#7570b3"
GP
