"""Prints the largest relative difference ||a - b|| / ||b|| over the tensors of two state_dict
files (meshsim export's and PyTorch's), as one JSON line: {"worst": ..., "tensors": N}
(tests/pytorch/test_pytorch_distributed.cpp). Both load with torch.load's defaults (in 2.6+,
weights_only=True), as a user's would. The Llama has no tensor whose gradient is zero in exact
arithmetic (a GPT's key bias is; tests/cli/compare_state_dicts.py floors the norm for it), so
no floor is needed here.
usage: compare_parameters.py MESHSIM.pt PYTORCH.pt"""
import json
import sys

import torch

a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
if sorted(a) != sorted(b):
    raise SystemExit(f"different keys: {sorted(set(a) ^ set(b))}")
worst = 0.0
for key in a:
    x, y = a[key].double(), b[key].double()
    if x.shape != y.shape:
        raise SystemExit(f"{key}: shape {tuple(x.shape)} against {tuple(y.shape)}")
    worst = max(worst, (x - y).norm().item() / y.norm().item())
print(json.dumps({"worst": worst, "tensors": len(a)}))
