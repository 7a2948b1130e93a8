"""Prints the largest relative difference ||a - b|| / ||b|| over the tensors of two state_dict
files (meshsim export's and PyTorch's), as one JSON line: {"worst": ..., "tensors": N}
(tests/pytorch/test_pytorch_distributed.cpp). As tests/cli/compare_state_dicts.py, except that
it loads meshsim's file under PyTorch 2.x's torch.load(weights_only=True): LibTorch's pickler
tags the dict's types with torch.jit._pickle.restore_type_tag, which 2.x's weights-only
unpickler refuses unless allowed.
usage: compare_parameters.py MESHSIM.pt PYTORCH.pt"""
import json
import sys

import torch
import torch.jit._pickle

allowed = [torch.jit._pickle.restore_type_tag]
with torch.serialization.safe_globals(allowed):
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
