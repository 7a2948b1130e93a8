"""Opens a meshsim memory snapshot (memory_snapshot/gpuN.pickle) with PyTorch's own viewer
functions, as torch.cuda._memory_viz does for torch.cuda.memory._dump_snapshot's files, and
prints what the test checks, as JSON."""
import json
import pickle
import sys

from torch.cuda import _memory_viz as viz

with open(sys.argv[1], "rb") as f:
    snapshot = pickle.load(f)

segments = snapshot["segments"]
# Neither version may download flamegraph.pl here: the flame graph's input lines are the result.
if hasattr(viz, "stats"):  # 1.13: the viewers take the list of segments
    flame = viz.segments(segments, format_flamegraph=lambda lines: lines)
    memory = viz.memory(segments, format_flamegraph=lambda lines: lines)
    viewer_total = viz.stats(segments)["total_size"].value
else:  # 2.x: the whole dict; segsum checks every segment's accounting and trace replays
    # device_traces, each raising on what it cannot read
    flame = viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    memory = viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    assert "total_allocated" in viz.segsum(snapshot) and viz.trace(snapshot)
    viewer_total = sum(viz._block_extra(b)[1] for s in segments for b in s["blocks"]
                       if b["state"] == "active_allocated")
assert flame and memory, "the viewers drew nothing"

trace = snapshot["device_traces"][0]
print(json.dumps({
    "viewer_total": viewer_total,
    "live_bytes": sum(b["size"] for s in segments for b in s["blocks"]),
    "segments": len(segments),
    "blocks": sum(len(s["blocks"]) for s in segments),
    "allocs": sum(1 for e in trace if e["action"] == "alloc"),
    "categories": sorted({e["frames"][0]["name"] for e in trace}),
    "phases": sorted({e["frames"][1]["name"] for e in trace}),
    "steps": sorted({e["frames"][1]["line"] for e in trace if e["frames"][1]["name"] != "after the last phase"}),
}))
