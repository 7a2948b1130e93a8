#!/usr/bin/env python3
"""Renders a meshsim trace.json to a PNG with headless Chromium, offline.

Chromium 156 (Debian 12) no longer ships chrome://tracing and ui.perfetto.dev needs the
network, so this draws the trace's complete ("X") events the way those viewers lay them out:
one track group per process (virtual GPU, measured or predicted), one row per thread
(compute, communication), time on the x axis, each timeline from its own start. With
--step N the measured timeline shows only step N (the predicted one holds one step anyway).

usage: render_trace.py RUN_DIR/trace.json OUT.png [--step N]
"""
import html
import json
import os
import subprocess
import sys
import tempfile

COLORS = {"forward": "#4e79a7", "backward": "#f28e2b", "optimizer": "#59a14f",
          "all_reduce": "#e15759", "broadcast": "#b07aa1", "all_gather": "#76b7b2",
          "reduce_scatter": "#edc948", "send": "#9c755f", "recv": "#bab0ac"}


def main():
    path, out = sys.argv[1], sys.argv[2]
    step = int(sys.argv[sys.argv.index("--step") + 1]) if "--step" in sys.argv else None
    events = json.load(open(path))["traceEvents"]
    names, threads = {}, {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    boxes = [e for e in events if e["ph"] == "X"]
    # Each timeline (measured, predicted) gets its own time origin: the predicted one starts at 0.
    def timeline_of(e):
        return "predicted" if "predicted" in names.get(e["pid"], "") else "measured"
    # --step: the measured step's compute regions, and what ran between their first start and
    # last end (its collectives).
    window = None
    if step is not None:
        mine = [e for e in boxes if timeline_of(e) == "measured" and e["cat"] == "compute"
                and e.get("args", {}).get("step") == step]
        window = (min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine))
    groups = {}
    for e in boxes:
        timeline = timeline_of(e)
        if window and timeline == "measured" and not window[0] <= e["ts"] <= window[1]:
            continue
        groups.setdefault(timeline, []).append(e)
    rows = sorted(threads)
    width, label_w, row_h = 1600, 480, 26
    svg = []
    y = 10
    for timeline in ("measured", "predicted"):
        evs = groups.get(timeline, [])
        if not evs:
            continue
        t0 = min(e["ts"] for e in evs)
        t1 = max(e["ts"] + e["dur"] for e in evs)
        scale = (width - label_w - 20) / max(t1 - t0, 1e-9)
        svg.append(f'<text x="10" y="{y + 16}" font-weight="bold">{timeline} timeline '
                   f'({(t1 - t0) / 1000:.3f} ms shown)</text>')
        y += 26
        for pid, tid in rows:
            if not any(e["pid"] == pid for e in evs):
                continue
            label = html.escape(f'{names.get(pid, pid)} / {threads[(pid, tid)]}')
            svg.append(f'<rect x="0" y="{y}" width="{width}" height="{row_h}" fill="#f4f4f4" '
                       f'stroke="#ddd"/><text x="6" y="{y + 17}" font-size="12">{label}</text>')
            for e in evs:
                if e["pid"] != pid or e["tid"] != tid:
                    continue
                x = label_w + (e["ts"] - t0) * scale
                w = max(e["dur"] * scale, 1)
                color = COLORS.get(e["name"], "#888")
                svg.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                           f'fill="{color}"><title>{html.escape(e["name"])}</title></rect>')
                if w > 40:
                    svg.append(f'<text x="{x + 3:.1f}" y="{y + 17}" font-size="11" '
                               f'fill="white">{html.escape(e["name"])}</text>')
            y += row_h
        y += 16
    page = (f'<html><body style="margin:0;font-family:sans-serif"><svg width="{width}" '
            f'height="{y}" xmlns="http://www.w3.org/2000/svg">{"".join(svg)}</svg></body></html>')
    with tempfile.TemporaryDirectory() as tmp:
        page_path = os.path.join(tmp, "trace.html")
        open(page_path, "w").write(page)
        subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                        f"--user-data-dir={tmp}/profile", f"--window-size={width},{y + 10}",
                        f"--screenshot={os.path.abspath(out)}", "file://" + page_path],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
