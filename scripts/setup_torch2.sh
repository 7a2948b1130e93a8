#!/usr/bin/env bash
# The second LibTorch: PyTorch 2.11 from PyPI in a project-local environment (ENV, default
# .torch2), with the packages its tests compare against (scripts/torch2-requirements.txt).
# Does nothing when ENV already holds exactly those versions. Prints the python to use.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${1:-.torch2}
requirements=scripts/torch2-requirements.txt

if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "meshsim setup: installing python3-venv" >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >&2
fi

# The environment is current when it holds every pinned version.
current() {
  [ -x "$env_dir/bin/python" ] || return 1
  "$env_dir/bin/python" - "$requirements" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, pinned = line.split("==")
        if version(name) != pinned:
            sys.exit(1)
PY
}

if ! current; then
  echo "meshsim setup: installing PyTorch 2.11 and its test packages into $env_dir (about 5 GB)" >&2
  [ -x "$env_dir/bin/python" ] || /usr/bin/python3 -m venv "$env_dir"
  "$env_dir/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" >&2
fi
echo "$(cd "$env_dir" && pwd)/bin/python"
