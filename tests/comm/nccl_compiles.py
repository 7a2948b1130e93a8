#!/usr/bin/env python3
"""NcclPath.CompilesAgainstLibTorchHeaders: the c10d backend's NCCL branch compiles.

A build without CUDA compiles that branch out (MESHSIM_C10D_NCCL=0), so nothing else would
notice it breaking. This compiles the c10d sources again, syntax and types only
(-fsyntax-only: there is no libtorch_cuda to link), with the flags the build used and the NCCL
branch switched on: MESHSIM_CUDA=1, MESHSIM_C10D_NCCL=1, USE_C10D_NCCL (the macro
ProcessGroupNCCL.hpp is guarded by), nccl.h from the CUDA toolkit.

C10_CUDA_NO_CMAKE_CONFIGURE_FILE: a CPU-only LibTorch lacks the header its CUDA build
generates (c10/cuda/impl/cuda_cmake_macros.h); this macro is c10's own switch for that.

Usage: nccl_compiles.py BUILD_DIR SOURCE_DIR. Exit 77 (skipped, with the reason) where it
cannot run: no nccl.h, no ProcessGroupNCCL.hpp, no Gloo, or a build that compiles the NCCL
branch itself.
"""
import json
import os
import shlex
import subprocess
import sys

SKIP = 77
SOURCES = ["src/comm/c10d_backend.cpp", "src/comm/c10d_communicator.cpp"]


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def main():
    build, source = sys.argv[1], sys.argv[2]
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    # Any meshsim_core source: they all share one set of flags.
    entry = next((e for e in entries if "meshsim_core.dir" in e.get("command", "")), None)
    if entry is None:
        skip("no meshsim_core entry in compile_commands.json")
    words = shlex.split(entry["command"])
    if "-DMESHSIM_C10D_NCCL=1" in words:
        skip("this build compiles the NCCL branch itself")
    if "-DMESHSIM_C10D_GLOO=1" not in words:
        skip("this build has no c10d backend (no Gloo headers in its LibTorch)")

    flags, includes = [], []
    i = 1
    while i < len(words):
        w = words[i]
        if w in ("-o", "-c", "-MF", "-MT", "-include", "-Xclang"):
            i += 2  # the object, the source, dependency files, the precompiled header
            continue
        if w in ("-MD", "-Winvalid-pch") or w.startswith("-DMESHSIM_CUDA=") or \
                w.startswith("-DMESHSIM_C10D_NCCL="):
            i += 1
            continue
        if w == "-isystem" and i + 1 < len(words):
            includes.append(words[i + 1])
            flags += [w, words[i + 1]]
            i += 2
            continue
        if w.startswith("-I"):
            includes.append(w[2:])
        flags.append(w)
        i += 1

    header = "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
    if not any(os.path.exists(os.path.join(d, header)) for d in includes + ["/usr/include"]):
        skip(f"LibTorch's headers have no {header}")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nccl = next((d for d in (os.path.join(cuda, "include"), "/usr/include")
                 if os.path.exists(os.path.join(d, "nccl.h"))), None)
    if nccl is None:
        skip(f"no nccl.h in {cuda}/include or /usr/include")

    # Both sources in one translation unit (as the unity build compiles them): LibTorch's
    # headers, most of the time, are parsed once, not once per source.
    unit = os.path.join(build, "nccl_path_unit.cpp")
    with open(unit, "w") as f:
        for src in SOURCES:
            f.write('#include "%s"\n' % os.path.join(os.path.abspath(source), src))
    cmd = [words[0]] + flags + [
        "-DMESHSIM_CUDA=1", "-DMESHSIM_C10D_NCCL=1", "-DUSE_C10D_NCCL",
        "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", "-isystem", nccl, "-fsyntax-only", unit]
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(f"{' and '.join(SOURCES)}: rc {done.returncode} (NCCL branch, nccl.h from {nccl})")
    if done.returncode != 0:
        print(done.stderr[-4000:])
    sys.exit(0 if done.returncode == 0 else 1)


if __name__ == "__main__":
    main()
