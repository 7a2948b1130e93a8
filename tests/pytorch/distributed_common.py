# What every comparison against PyTorch's distributed stack shares (tests/pytorch/
# test_pytorch_distributed.cpp): meshsim's Llama as PyTorch builds it (tests/models/
# reference_llama.py, the same init for the seed), meshsim's synthetic token data and its
# DistributedSampler order, SGD with momentum, one Gloo process per rank on the CPU, and what
# a run reports: the loss of every step (averaged over the global batch, as meshsim logs it),
# the final parameters as one state_dict, and each rank's model-state bytes as PyTorch's
# memory trackers (torch.distributed._tools) count them.
#
# A script for one API (reference_ddp.py, ...) calls run(layout), where layout(model, spec,
# rank, world) applies the API to the model and returns a Layout: how to run one step's
# forward and backward, which tensors the optimizer updates, and how to gather the full
# parameters back. The training runs in float64; a second, one-step run of the same layout
# in float32 (meshsim's dtype) is the one the memory tracker watches, so its bytes are the
# bytes meshsim's run holds.
#
# usage: reference_API.py SPEC.json     (one comparison; SPEC: see spec_help below)
#        distributed_common.py JOBS.json  (a list of SPECs, each with "api": ddp | fsdp | tp |
#                                         pipelining, run one after another in this process,
#                                         so that PyTorch is imported once)
import gc
import json
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import functional as F
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import reference_llama  # noqa: E402

spec_help = """SPEC keys: layers hidden heads kv_heads ffn seq_len vocab theta seed (the model, as
meshsim's --flags); synthetic_train, batch_size (per data-parallel replica), steps, lr,
momentum; world (processes), dp (data-parallel replicas among them); out (the JSON written;
the ranks meet in a file store beside it, out + ".store"), state_dict (the final parameters);
plus what the layout reads."""


@dataclass
class Layout:
    # Runs one step's forward and backward on this rank's batch (inputs, targets: the whole
    # replica batch) and returns the step's loss on this replica (a float, meaningful on
    # every rank that returns one; None where the rank computes no loss).
    step: Callable
    # The tensors the optimizer updates on this rank.
    parameters: list
    # The full parameters (name -> tensor), on rank 0 (collective: every rank calls it).
    full_state: Callable
    # The modules whose parameters the memory tracker attributes (MemTracker.track_external).
    modules: list
    # The root a FSDPMemTracker wraps (FSDP2 layouts); None: MemTracker.
    fsdp_root: object = None


def synthetic_tokens(spec):
    """meshsim's synthetic_text (src/data/text.cpp): a generator seeded with --seed draws each
    sample's start in [0, vocab) and stride in [1, 4); sample i is (start + stride·k) % vocab
    for k = 0..seq_len, inputs its first seq_len tokens, targets its last."""
    gen = torch.Generator().manual_seed(spec["seed"])
    count, seq_len, vocab = spec["synthetic_train"], spec["seq_len"], spec["vocab"]
    start = torch.randint(vocab, (count, 1), generator=gen, dtype=torch.long)
    stride = torch.randint(1, 4, (count, 1), generator=gen, dtype=torch.long)
    seq = (start + stride * torch.arange(seq_len + 1)).remainder(vocab)
    return seq[:, :seq_len].contiguous(), seq[:, 1:].contiguous()


def replica_batches(spec, dp_rank):
    """The batches replica dp_rank trains on, step by step: torch's DistributedSampler (which
    meshsim's reproduces, src/data/sampler.h), shuffled with --seed, epoch after epoch."""
    inputs, targets = synthetic_tokens(spec)
    sampler = DistributedSampler(range(len(inputs)), num_replicas=spec["dp"], rank=dp_rank,
                                 shuffle=True, seed=spec["seed"])
    b = spec["batch_size"]
    steps_per_epoch = (len(sampler) + b - 1) // b
    batches, epoch = [], 0
    while len(batches) < spec["steps"]:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for s in range(steps_per_epoch):
            if len(batches) == spec["steps"]:
                break
            idx = torch.tensor(order[s * b:(s + 1) * b])
            batches.append((inputs[idx], targets[idx]))
        epoch += 1
    return batches


def build_model(spec, dtype):
    model = reference_llama.build(spec["layers"], spec["hidden"], spec["heads"], spec["kv_heads"],
                                  spec["ffn"], spec["vocab"], spec["theta"], spec["seed"])
    return model.to(dtype)


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(spec, parameters):
    # meshsim's --optimizer (src/optim/optimizer.cpp): sgd is torch.optim.SGD with momentum,
    # no dampening, no Nesterov, no weight decay; adam is torch.optim.Adam with its defaults
    # (betas 0.9, 0.999, eps 1e-8, no weight decay, no amsgrad). foreach=False: the
    # per-tensor loop, the order meshsim updates in (the same elementwise either way).
    if spec.get("optimizer", "sgd") == "adam":
        return torch.optim.Adam(parameters, lr=spec["lr"], foreach=False)
    return torch.optim.SGD(parameters, lr=spec["lr"], momentum=spec["momentum"], foreach=False)


class _CategoryPeaks:
    """Wraps a tracker's _update_snap so that each category's own peak is kept (the tracker
    keeps the categories at the moment of the total's peak, meshsim each one's peak)."""

    def __init__(self, tracker):
        self.peaks = {}
        original = tracker._update_snap

        def update(*args, **kwargs):
            original(*args, **kwargs)
            for snap in tracker._curr_mem_snap.values():
                named = {str(getattr(k, "value", k)): v for k, v in snap.items()}
                # meshsim charges a step's forward and backward tensors alike to
                # "activations"; the trackers split them into Activation (made in forward)
                # and Temp (made in backward): their sum is the comparable figure.
                named["Activation+Temp"] = named.get("Activation", 0) + named.get("Temp", 0)
                for name, value in named.items():
                    self.peaks[name] = max(self.peaks.get(name, 0), value)

        tracker._update_snap = update


def _current(tracker):
    out = {}
    for snap in tracker.get_tracker_snapshot("current").values():
        for key, value in snap.items():
            name = str(getattr(key, "value", key))
            out[name] = out.get(name, 0) + value
    return out


def _memtracker_for_micro_batches():
    """MemTracker, except that a root module may run forward more than once in the tracked
    region: a pipeline stage runs once per micro-batch, which MemTracker refuses as "multiple
    iterative calls" (it keeps per-module statistics per iteration). Only its per-category
    bytes are read here, so each such call starts the module's statistics afresh; its
    parameters and gradients stay tracked (their storages are known already)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class MicroBatchMemTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):
            name = self._mod_tracker.get_known_fqn(module)
            parents = set(self._mod_tracker.parents) - {name}
            if (module in self.memory_tracking and not self._mod_tracker.is_bw
                    and parents == {"Global"}):
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return MicroBatchMemTracker()


def tracked_step(spec, layout_fn, rank, world, batch):
    """One float32 step of the layout under PyTorch's memory tracker: the model-state bytes
    after the optimizer's step (what meshsim's model_state_bytes measures) and each
    category's peak."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    model = build_model(spec, torch.float32)
    layout = layout_fn(model, spec, rank, world)
    optimizer = make_optimizer(spec, layout.parameters)
    if layout.fsdp_root is not None:
        tracker = FSDPMemTracker(layout.fsdp_root, optimizer)
    else:
        tracker = _memtracker_for_micro_batches()
        tracker.track_external(*layout.modules, optimizer)
    peaks = _CategoryPeaks(tracker)
    with tracker:
        optimizer.zero_grad()
        layout.step(*batch)
        optimizer.step()
        # The state after the step, once every rank is past it and Python has let go of the
        # step's temporaries: read at once, a loaded machine once caught a 128-byte
        # temporary of the step still alive and filed as optimizer state (tp with sequence
        # parallelism, PyTorch 2.11).
        dist.barrier()
        gc.collect()
        after = _current(tracker)
    return {"after_step": after, "peaks": peaks.peaks}


def _rank_main(rank, world, spec, layout_fn):
    torch.set_num_threads(1)
    # The ranks meet in a file, not at a TCP port chosen beforehand: a port picked when the
    # suite starts can be taken by another test's processes before this job runs (its ranks
    # then wait on a stranger's store until the test times out). Gloo's own connections bind
    # ports the kernel hands out.
    dist.init_process_group("gloo", init_method="file://" + spec["out"] + ".store", rank=rank,
                            world_size=world)
    try:
        dp_rank = rank * spec["dp"] // world  # meshsim's rank order: dp outermost
        batches = replica_batches(spec, dp_rank)
        model = build_model(spec, torch.float64)
        layout = layout_fn(model, spec, rank, world)
        optimizer = make_optimizer(spec, layout.parameters)
        losses = []
        for inputs, targets in batches:
            optimizer.zero_grad()
            loss = layout.step(inputs, targets)
            # The step's loss over the global batch: the mean of the replicas' (each replica's
            # batch is the same size); ranks that compute none add 0 and are not counted.
            t = torch.tensor([loss if loss is not None else 0.0, 1.0 if loss is not None else 0.0],
                             dtype=torch.float64)
            dist.all_reduce(t)
            losses.append((t[0] / t[1]).item())
            optimizer.step()
        state = layout.full_state()
        memory = tracked_step(spec, layout_fn, rank, world, batches[0])
        gathered = [None] * world
        dist.all_gather_object(gathered, memory)
        if rank == 0:
            torch.save({k: v.detach().clone() for k, v in state.items()}, spec["state_dict"])
            with open(spec["out"], "w") as f:
                json.dump({"losses": losses, "memory": gathered}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def plain_full_state(model):
    """The state of a model every rank holds whole (DDP, or a model not split at all)."""
    return {k: v.detach() for k, v in model.state_dict().items()}


def run_one(spec, layout_fn):
    store = spec["out"] + ".store"
    if os.path.exists(store):  # a file store must start empty
        os.remove(store)
    # fork: the ranks inherit the imported PyTorch (a spawned process imports it again, seconds
    # on a busy machine).
    mp.start_processes(_rank_main, args=(spec["world"], spec, layout_fn), nprocs=spec["world"],
                       join=True, start_method="fork")


def read_spec():
    if len(sys.argv) != 2:
        raise SystemExit("usage: " + sys.argv[0] + " SPEC.json\n" + spec_help)
    with open(sys.argv[1]) as f:
        return json.load(f)


def run(layout_fn):
    run_one(read_spec(), layout_fn)


if __name__ == "__main__":
    import importlib

    for job in read_spec():
        run_one(job, importlib.import_module("reference_" + job["api"]).layout)
