# DTensor tensor parallelism (parallelize_module with ColwiseParallel, RowwiseParallel and,
# with "sequence_parallel", SequenceParallel) against meshsim's --tp 2 [--sequence-parallel] on
# the Llama, in meshsim's plan (src/models/llama_plan.cpp): q, k, v, gate, up column-parallel;
# o, down row-parallel; the head column-parallel over the vocabulary; the embedding and the
# norms whole on every rank. With sequence parallelism the norms and residuals hold 1/tp of
# the sequence: the embedding's output is split over it, the attention's and the MLP's input
# gathered whole, o's and down's output reduce-scattered, and the head's input gathered.
# usage: reference_tp.py SPEC.json (distributed_common.py)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from distributed_common import Layout, loss_of, run


def layout(model, spec, rank, world):
    mesh = init_device_mesh("cpu", (world,))
    sp = bool(spec["sequence_parallel"])
    residual = Shard(1) if sp else Replicate()  # the residual stream's layout between blocks
    for l in range(spec["layers"]):
        block = getattr(model, f"block{l}")
        plan = {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=residual),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=residual),
        }
        if sp:
            plan.update({
                "attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                          desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, mesh, plan)
        # Each rank computes its own heads (whole heads: both counts divide by tp).
        block.attn.heads //= world
        block.attn.kv_heads //= world
    top = {"head": ColwiseParallel(input_layouts=residual, output_layouts=Replicate())}
    if sp:
        top["embed"] = PrepareModuleOutput(output_layouts=Replicate(),
                                           desired_output_layouts=Shard(1))
        top["norm_f"] = SequenceParallel()
    parallelize_module(model, mesh, top)

    def step(inputs, targets):
        loss = loss_of(model(inputs), targets)
        loss.backward()
        return loss.item()

    def full_state():
        return {k: v.full_tensor() if isinstance(v, DTensor) else v.detach()
                for k, v in model.state_dict().items()}

    return Layout(step=step, parameters=list(model.parameters()), full_state=full_state,
                  modules=[model])


if __name__ == "__main__":
    run(layout)
