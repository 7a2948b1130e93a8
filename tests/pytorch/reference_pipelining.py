# torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B) against
# meshsim's --pp 2 --schedule gpipe | 1f1b [--virtual-stages 2]: the model cut where meshsim
# cuts it (src/parallel/pipeline/pipeline.cpp: each block starts a unit, the embedding joins
# the first, the final norm and the head the last; pp × virtual stages chunks of near-equal
# units, chunk c on rank c % pp), every micro-batch's loss the mean cross-entropy of its
# tokens and the gradients scaled by 1 / micro-batches (scale_grads), so a step's gradient is
# the mean over the batch, as meshsim's.
# usage: reference_pipelining.py SPEC.json (distributed_common.py)
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

from distributed_common import Layout, loss_of, run


def chunk_children(model, chunks):
    """meshsim's cut: the names of the model's children in each of `chunks` chunks."""
    names = [name for name, _ in model.named_children()]
    starts = [i for i, name in enumerate(names) if name.startswith("block")]
    starts[0] = 0
    base, extra = divmod(len(starts), chunks)
    out = []
    for c in range(chunks):
        first = c * base + min(c, extra)
        end = first + base + (1 if c < extra else 0)
        out.append(names[starts[first]:starts[end] if end < len(starts) else len(names)])
    return out


def layout(model, spec, rank, world):
    virtual = spec["virtual_stages"]
    chunks = world * virtual
    children = dict(model.named_children())
    mine = [c for c in range(chunks) if c % world == rank]
    modules = [nn.Sequential(OrderedDict((n, children[n]) for n in chunk_children(model, chunks)[c]))
               for c in mine]
    stages = [PipelineStage(m, c, chunks, torch.device("cpu")) for m, c in zip(modules, mine)]
    micro = spec["micro_batches"]
    schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[spec["schedule"]]
    if virtual > 1:
        runner = ScheduleInterleaved1F1B(stages, micro, loss_fn=loss_of)
    else:
        runner = schedule(stages[0], micro, loss_fn=loss_of)
    first, last = 0 in mine, chunks - 1 in mine

    def step(inputs, targets):
        losses = []
        args = (inputs,) if first else ()
        kwargs = {"target": targets, "losses": losses} if last else {}
        runner.step(*args, **kwargs)
        return torch.stack(losses).mean().item() if last else None

    def full_state():
        local = {k: v.detach() for m in modules for k, v in m.state_dict().items()}
        every = [None] * world
        dist.all_gather_object(every, local)
        return {k: v for part in every for k, v in part.items()}

    return Layout(step=step, parameters=[p for m in modules for p in m.parameters()],
                  full_state=full_state, modules=modules)


if __name__ == "__main__":
    run(layout)
