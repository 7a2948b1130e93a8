# Loads a state_dict written by `meshsim export RUN --state-dict FILE` into PyTorch's own
# definition of the model with strict=True, evaluates it on test data, and prints one JSON
# line: the accuracy (argmax of each prediction against its target, as meshsim scores it),
# the mean cross-entropy, and how many predictions are too close to call in float32.
#
# The models: cnn is the positional nn.Sequential of bench/pytorch_ddp.py; lenet is PyTorch's
# MNIST example's Net; gpt and llama are reference_gpt.py and reference_llama.py (beside this
# file).
#
# usage: load_state_dict.py STATE_DICT TEST_DATA MODEL [SHAPE...]
#        load_state_dict.py JOBS.json      (a list of [STATE_DICT, TEST_DATA, MODEL, SHAPE...]:
#                                          one process, one line per job, in order)
#   TEST_DATA: a torch.load-able dict with "inputs" and "targets"
#   gpt:   LAYERS HIDDEN HEADS SEQ_LEN VOCAB TIE FFN
#   llama: LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB THETA
import json
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


class LeNet(nn.Module):  # pytorch/examples mnist/main.py (the DDP demo's net)
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def build(name, shape):
    if name == "cnn":
        return cnn()
    if name == "lenet":
        return LeNet()
    if name == "gpt":
        import reference_gpt
        layers, hidden, heads, seq_len, vocab, tie, ffn = map(int, shape)
        return reference_gpt.build(layers, hidden, heads, seq_len, vocab, bool(tie), 0, ffn)
    if name == "llama":
        import reference_llama
        layers, hidden, heads, kv_heads, ffn, vocab = map(int, shape[:6])
        return reference_llama.build(layers, hidden, heads, kv_heads, ffn, vocab, float(shape[6]), 0)
    raise SystemExit(f"unknown model {name}")


def check(state_path, data_path, name, *shape):
    model = build(name, shape)
    state = torch.load(state_path, weights_only=True)
    model.load_state_dict(state, strict=True)
    model.eval()
    data = torch.load(data_path, weights_only=True)
    inputs, targets = data["inputs"], data["targets"]
    with torch.no_grad():
        logits = model(inputs)
        exact = model.double()(inputs.double() if inputs.is_floating_point() else inputs)
    classes = logits.shape[-1]
    logits, exact, targets = logits.reshape(-1, classes), exact.reshape(-1, classes), targets.reshape(-1)
    accuracy = logits.argmax(-1).eq(targets).double().mean().item()
    loss = F.cross_entropy(logits, targets).item()
    # A prediction is too close to call when its two best logits (in float64) are nearer than
    # float32's rounding could move them: e, its largest float32 error measured against
    # float64 (at least one unit in the last place of its largest logit), moves the margin by
    # up to 2e in one evaluation; meshsim's evaluation sums in other orders (other kernels,
    # shards reduced across ranks), an independent error of the same size: 4e; and another
    # factor 2 because meshsim's error is not measured here, only assumed to be of that size.
    err = (logits.double() - exact).abs().amax(-1)
    ulp = exact.abs().amax(-1) * 2.0 ** -23
    top2 = exact.topk(2, -1).values
    uncertain = ((top2[:, 0] - top2[:, 1]) <= 8 * torch.maximum(err, ulp)).sum().item()
    print(json.dumps({"accuracy": accuracy, "predictions": targets.numel(), "uncertain": uncertain,
                      "loss": loss, "keys": len(state),
                      "dtypes": sorted({str(t.dtype) for t in state.values()})}), flush=True)


def main():
    if len(sys.argv) == 2:
        with open(sys.argv[1]) as f:
            for job in json.load(f):
                check(*map(str, job))
    else:
        check(*sys.argv[1:])


main()
