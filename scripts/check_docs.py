#!/usr/bin/env python3
"""Reruns the examples of docs/ and the README that show `meshsim plan`, `models`, `bench`,
`train` or `export` with their output, and prints each printed line the binary no longer prints.

    python3 scripts/check_docs.py [build/meshsim] [--search] [--no-train]

An example is a line `$ meshsim ...` or `$ build/meshsim ...` (continued by a trailing
backslash) in a fenced block, its output the lines after it up to the next `$ ` or the fence.
What differs from machine to machine or run to run is compared with its number masked: how long
something took ("(3.9 s)", "in 9.1 s", "done: ..., 1.2 s;"), a training run's memory per GPU
("5.89 GiB each", "of 5.89 GiB in use"), its threads per rank and samples per second, the
folder a run without --out makes; and `bench comm` rows only in their model's columns.
Examples with `...` in their command, and output lines that start with `...`, are abridged and
skipped. A `plan`'s `--out` is replaced by a fresh folder. The `train` and `export` examples of
one page run in order in one scratch folder, so that a `--resume runs/a` finds the `runs/a` an
example before it wrote; a `/tmp/...` path in them is moved into that folder and named back in
their output. An example that shows an error passes when it prints that line, whatever its
exit status. `--search` adds the `plan --search` examples (about two minutes on 2 cores);
`--no-train` leaves out the `train` and `export` ones (which take about two minutes); the rest
take about one.
Exit status: 0 when every line matches, 1 when some did not.
"""
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"^\$ (?:build/)?meshsim (plan|models|bench|train|export)\b")
RUNS = ("train", "export")  # the commands whose examples run in order in the page's folder
TIMING = re.compile(r"(\(|\bin |%, )\d+(?:\.\d+)? s\b")
# A training run's memory per virtual GPU is the machine's memory shared out, and its threads
# per rank the machine's cores.
MACHINE = [(re.compile(r"\d+(?:\.\d+)? GiB (each|in use)"), r"N GiB \1"),
           (re.compile(r"\d+ threads per rank"), "N threads per rank"),
           (re.compile(r"\bruns/\d{8}-\d{6}\b"), "runs/DATE-TIME"),
           (re.compile(r"^(step \d+/\d+ epoch \d+ loss \S+) \d+ samples/s$"), r"\1 N samples/s")]


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


def normal(line, kind):
    line = TIMING.sub(r"\1N s", " ".join(line.split()))
    if kind in RUNS:
        for pattern, mask in MACHINE:
            line = pattern.sub(mask, line)
    if kind == "bench" and "|" in line:  # the model's columns, not the in-process measurement's
        line = line.split("|")[0].strip()
    return line


def run(binary, words, page_folder):
    """Runs one example; returns what it printed, with the folders it was given named back."""
    kind = words[0]
    if kind in RUNS:
        # One folder for the page's runs, in order: an example may resume an earlier one's.
        cwd, scratch = page_folder, None
        words = [cwd + w if w.startswith("/tmp/") else w for w in words]
    else:
        # A fresh folder for each: an --out the docs name may be left from an earlier run.
        cwd = scratch = tempfile.mkdtemp(prefix="check-docs-")
        words = [scratch + "/out" if i > 0 and words[i - 1] == "--out" else w
                 for i, w in enumerate(words)]
    try:
        done = subprocess.run([str(binary)] + words, capture_output=True, text=True, cwd=cwd,
                              timeout=900)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return done.returncode, (done.stdout + done.stderr).replace(cwd + "/tmp/", "/tmp/")


def main():
    unknown = [a for a in sys.argv[1:] if a.startswith("-") and a not in ("--search", "--no-train")]
    if unknown:
        sys.exit(f"check_docs: unknown option {unknown[0]} (options: --search, --no-train)")
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    binary = pathlib.Path(args[0] if args else ROOT / "build" / "meshsim").resolve()
    if not binary.is_file():
        sys.exit(f"check_docs: {binary} not found: build meshsim first (make build)")
    search = "--search" in sys.argv[1:]
    train = "--no-train" not in sys.argv[1:]
    docs = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    checked = stale = 0
    for doc in docs:
        page_folder = tempfile.mkdtemp(prefix="check-docs-")
        pathlib.Path(page_folder, "tmp").mkdir()
        for line, command, shown in examples(doc):
            words = command.split()[1:]
            if ("--search" in words and not search) or (words[0] in RUNS and not train):
                continue
            print(f"{doc.relative_to(ROOT)}:{line}: meshsim {' '.join(words)}", file=sys.stderr)
            status, output = run(binary, words, page_folder)
            printed = {normal(x, words[0]) for x in output.split("\n")}
            checked += 1
            missing = [x for x in shown if x.strip() and not x.strip().startswith("...")
                       and normal(x, words[0]) not in printed]
            if status != 0 and (missing or not any(x.strip() for x in shown)):
                print(f"{doc.relative_to(ROOT)}:{line}: exit {status}: "
                      f"{(output.strip().splitlines() or [''])[-1]}")
                stale += 1
                continue
            for x in missing:
                print(f"{doc.relative_to(ROOT)}:{line}: no longer printed: {x.strip()}")
            stale += bool(missing)
        shutil.rmtree(page_folder, ignore_errors=True)
    print(f"check_docs: {checked} examples run, {stale} with lines that no longer match",
          file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
