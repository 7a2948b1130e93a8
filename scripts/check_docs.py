#!/usr/bin/env python3
"""Reruns the examples of docs/ and the README that show `meshsim plan`, `models` or `bench`
with their output, and prints each printed line the binary no longer prints.

    python3 scripts/check_docs.py [build/meshsim] [--search]

An example is a line `$ meshsim ...` or `$ build/meshsim ...` (continued by a trailing
backslash) in a fenced block, its output the lines after it up to the next `$ ` or the fence.
Lines that say how long something took on the machine that wrote them ("(3.9 s)", "in 9.1 s",
"(12 s)"), and the columns `bench comm` measures on the in-process backend, differ from run to
run: a timing is compared with its number masked, and a bench comm row only in its model's
columns. Examples with `...` in their command, and output lines that start with `...`, are
abridged and skipped; an `--out` is replaced by a fresh folder. `--search` adds the
`plan --search` examples (about two minutes on 2 cores); the rest take about one.
Exit status: 0 when every line matches, 1 when some did not.
"""
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"^\$ (?:build/)?meshsim (plan|models|bench)\b")
TIMING = re.compile(r"(\(|\bin )\d+(?:\.\d+)? s\b")


def examples(path):
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if not COMMAND.match(lines[i]) or "..." in lines[i]:
            i += 1
            continue
        start, command = i, lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("```") and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        yield start + 1, command, shown


def normal(line, bench):
    line = TIMING.sub(r"\1N s", " ".join(line.split()))
    if bench and "|" in line:  # the model's columns, not the in-process measurement's
        line = line.split("|")[0].strip()
    return line


def main():
    args = [a for a in sys.argv[1:] if a != "--search"]
    binary = pathlib.Path(args[0] if args else ROOT / "build" / "meshsim").resolve()
    if not binary.is_file():
        sys.exit(f"check_docs: {binary} not found: build meshsim first (make build)")
    search = "--search" in sys.argv[1:]
    docs = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    checked = stale = 0
    for doc in docs:
        for line, command, shown in examples(doc):
            if "--search" in command and not search:
                continue
            words = command.split()[1:]
            print(f"{doc.relative_to(ROOT)}:{line}: meshsim {' '.join(words)}", file=sys.stderr)
            bench = words[0] == "bench"
            # A fresh folder for each: an --out the docs name may be left from an earlier run.
            scratch = tempfile.mkdtemp(prefix="check-docs-")
            words = [scratch + "/out" if i > 0 and words[i - 1] == "--out" else w
                     for i, w in enumerate(words)]
            try:
                run = subprocess.run([str(binary)] + words, capture_output=True, text=True,
                                     cwd=scratch, timeout=900)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            printed = {normal(x, bench) for x in (run.stdout + run.stderr).split("\n")}
            checked += 1
            if run.returncode != 0:
                print(f"{doc.relative_to(ROOT)}:{line}: exit {run.returncode}: "
                      f"{(run.stderr.strip().splitlines() or [''])[-1]}")
                stale += 1
                continue
            missing = [x for x in shown if x.strip() and not x.strip().startswith("...")
                       and normal(x, bench) not in printed]
            for x in missing:
                print(f"{doc.relative_to(ROOT)}:{line}: no longer printed: {x.strip()}")
            stale += bool(missing)
    print(f"check_docs: {checked} examples run, {stale} with lines that no longer match",
          file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
