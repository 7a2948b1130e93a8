# DistributedDataParallel against meshsim's --strategy ddp: each rank a replica of the whole
# model on its own shard of the batch, gradients averaged by DDP's bucketed all-reduce.
# usage: reference_ddp.py SPEC.json (distributed_common.py)
from torch.nn.parallel import DistributedDataParallel

from distributed_common import Layout, loss_of, plain_full_state, run


def layout(model, spec, rank, world):
    ddp = DistributedDataParallel(model)

    def step(inputs, targets):
        loss = loss_of(ddp(inputs), targets)
        loss.backward()
        return loss.item()

    return Layout(step=step, parameters=list(ddp.parameters()),
                  full_state=lambda: plain_full_state(model), modules=[ddp])


if __name__ == "__main__":
    run(layout)
