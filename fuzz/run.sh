#!/usr/bin/env bash
# `make fuzz`: installs clang and libFuzzer when missing, builds the fuzz targets (clang,
# AddressSanitizer + UBSan) in build-fuzz, and runs each for a fixed number of inputs over a
# temporary copy of its seed corpus (fuzz/corpus/<target>/), so the inputs it discovers never
# land in the repo. Crash inputs are kept in build-fuzz/artifacts/. Exits non-zero on any
# crash. FUZZ_RUNS=N runs every target N times instead of the defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD:-build-fuzz}
jobs=${JOBS:-$(nproc)}

missing=()
command -v clang++ >/dev/null || missing+=(clang)
compgen -G "/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null ||
  missing+=(libclang-rt-14-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev
fi

echo "fuzz: building the targets in $build (log: $build/fuzz-build.log)"
mkdir -p "$build"
# A new build folder is configured for Ninja, as make's are; one configured before keeps its
# generator.
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
if ! { CC=clang CXX=clang++ cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMESHSIM_FUZZ=ON \
  -DMESHSIM_TESTS=OFF -DMESHSIM_BENCH=OFF && cmake --build "$build" -j "$jobs" \
  --target meshsim_fuzzers; } >"$build/fuzz-build.log" 2>&1; then
  tail -n 40 "$build/fuzz-build.log"
  echo "fuzz: build failed"
  exit 1
fi

# Per target: the longest input worth trying, and the inputs run. Measured on 2 cores: the
# string parsers run 50-100k inputs/s, the JSON ones 25-35k/s, the IDX reader ~10k/s (a file
# and tensors per input), the safetensors reader ~15k/s, meshsim serve's request parser ~10k/s
# (30 s); the defaults give the first eleven 10-35 s each and the last two about 2 and 5
# minutes, 5.15 million inputs in all.
targets=(
  # name           max_len  runs
  "fuzz_size       64       1000000"
  "fuzz_cluster    128      600000"
  "fuzz_text       512      300000"
  "fuzz_records    4096     300000"
  "fuzz_config     4096     300000"
  "fuzz_hf_config  4096     300000"
  "fuzz_checkpoint 4096     300000"
  "fuzz_idx        2048     150000"
  "fuzz_safetensors 4096    300000"
  "fuzz_routing    2048     300000"
  "fuzz_plan_request 4096   300000"
  # the two below: 1 million more, about 7 minutes (fuzz_cli ~6,500/s, fuzz_predict_values
  # ~700/s: a prediction replayed per input). fuzz_cli prints each refusal, as meshsim does:
  # its stderr is closed (libFuzzer's own reports still come, and a crash leaves its input).
  "fuzz_cli        1024     800000  -close_fd_mask=2"
  "fuzz_predict_values 4096 200000"
)

work=$(mktemp -d /tmp/meshsim-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
artifacts="$build/artifacts"
mkdir -p "$artifacts"
total_runs=0
crashes=0
start_all=$(date +%s%N)
for line in "${targets[@]}"; do
  read -r name max_len runs extra <<<"$line"
  runs=${FUZZ_RUNS:-$runs}
  cp -r "fuzz/corpus/$name" "$work/$name"
  start=$(date +%s%N)
  status=0
  # Leak checking is off: LibTorch and zlib keep process-lifetime buffers.
  ASAN_OPTIONS=detect_leaks=0 "$build/$name" -runs="$runs" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=0 -artifact_prefix="$artifacts/$name-" ${extra:-} \
    "$work/$name" >"$work/$name.log" 2>&1 || status=$?
  ms=$((($(date +%s%N) - start) / 1000000))
  done_runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/$name.log")
  if [ "$status" -ne 0 ] || [ -z "$done_runs" ]; then
    crashes=$((crashes + 1))
    done_runs=$(grep -o '^#[0-9]*' "$work/$name.log" | tail -1 | tr -d '#' || true)
    echo "fuzz: $name FAILED (exit $status); its log ends:"
    tail -n 30 "$work/$name.log"
    cp "$work/$name.log" "$artifacts/$name.log"
  fi
  total_runs=$((total_runs + ${done_runs:-0}))
  printf 'fuzz: %-16s %8s inputs in %4d.%d s\n' "$name" "${done_runs:-0}" $((ms / 1000)) \
    $((ms % 1000 / 100))
done
seconds=$((($(date +%s%N) - start_all) / 1000000000))
echo "fuzz: $total_runs inputs in $seconds s, $crashes crashes"
[ "$crashes" -eq 0 ]
