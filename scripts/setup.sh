#!/usr/bin/env bash
# Installs the Debian packages meshsim needs, only those that are missing.
# Runs as root (or with sudo) on Debian 12; does nothing when all are present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev        # LibTorch 1.13 (CPU) with c10d, and the Gloo headers
  libopenblas0-openmp             # the BLAS LibTorch recommends: Debian's reference BLAS, which
                                  # --no-install-recommends leaves, multiplies several times slower;
                                  # this build takes ATen's threads from OpenMP (meshsim info says which)
  nlohmann-json3-dev libfmt-dev libcli11-dev zlib1g-dev libgtest-dev
  dataset-fashion-mnist           # the real Fashion-MNIST, the default data
  gnuplot-nox                     # draws memory.png
  libcpp-httplib-dev              # meshsim serve's HTTP server
  chromium                        # headless, loads report.html and plan.html in the tests
  chromium-driver python3-selenium  # drive the serve page in the browser test (make test)
  python3-torch                   # PyTorch itself: the reference in tests and benchmarks
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "meshsim setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
