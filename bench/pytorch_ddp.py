# PyTorch's own DDP (Gloo, one process per rank on this machine) training the same CNN with
# the same global batch, as the reference for benchmark (b). Prints the training loop's
# seconds (after setup and a warm-up step, like meshsim's train_seconds).
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def worker(rank, world, steps, batch, port, result, device):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    if device == "cuda":  # every process on the one card; Gloo moves CUDA tensors via the host
        model = nn.parallel.DistributedDataParallel(cnn().cuda(), device_ids=[0])
    else:
        model = nn.parallel.DistributedDataParallel(cnn())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    x, y = x.to(device), y.to(device)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    step()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        result.value = time.perf_counter() - start
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()
    result = mp.get_context("spawn").Value("d", 0.0)
    mp.start_processes(worker, args=(a.world, a.steps, a.global_batch // a.world, a.port, result, a.device),
                       nprocs=a.world, start_method="spawn")
    print(f"{result.value:.3f}")


if __name__ == "__main__":
    main()
