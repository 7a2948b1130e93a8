"""Prints, for each pair of state_dict files given (A1 B1 A2 B2 ...), the largest relative
difference ||a - b|| / max(||b||, 1e-5) over their tensors, one JSON object per line (meshsim
export's files; tests/cli/test_cli_processes.cpp). The floor is strategy_harness.h's: a GPT's
key bias gets no gradient in exact arithmetic (softmax ignores a shift shared by all keys), so
both runs hold only rounding noise there, ~1e-9, whose ratio means nothing."""
import json
import sys

import torch

args = sys.argv[1:]
for a_path, b_path in zip(args[0::2], args[1::2]):
    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    if sorted(a) != sorted(b):
        print(json.dumps({"error": f"different keys: {sorted(set(a) ^ set(b))}"}))
        continue
    worst = 0.0
    for key in a:
        x, y = a[key].double(), b[key].double()
        if x.shape != y.shape:
            worst = float("inf")
            break
        scale = max(y.norm().item(), 1e-5)
        worst = max(worst, (x - y).norm().item() / scale)
    print(json.dumps({"worst": worst, "tensors": len(a)}))
