# Prints, for each parameter of PyTorch's own model, its sum and the sum of its absolute
# values (float64), so the C++ test can compare initial weights for the same seed.
import sys

import torch
from torch import nn

name, seed = sys.argv[1], int(sys.argv[2])
torch.manual_seed(seed)
if name == "cnn":
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
else:  # lenet, in the order of PyTorch's MNIST example
    conv1 = nn.Conv2d(1, 10, 5)
    conv2 = nn.Conv2d(10, 20, 5)
    fc1 = nn.Linear(320, 50)
    fc2 = nn.Linear(50, 10)
    model = nn.Sequential(conv1, conv2, fc1, fc2)
for p in model.parameters():
    p = p.detach().double()
    print(repr(p.sum().item()), repr(p.abs().sum().item()))
