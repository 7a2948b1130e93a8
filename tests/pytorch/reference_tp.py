# DTensor tensor parallelism (parallelize_module with ColwiseParallel, RowwiseParallel and,
# with "sequence_parallel", SequenceParallel) against meshsim's --tp 2 [--sequence-parallel] on
# the Llama, in meshsim's plan (src/models/llama_plan.cpp): q, k, v, gate, up column-parallel;
# o, down row-parallel; the head column-parallel over the vocabulary; the word embedding split
# over the vocabulary too (each rank its rows, the lookups summed over the ranks, Megatron's
# VocabParallelEmbedding; the reference Llama's embedding is not an nn.Embedding, so DTensor's
# RowwiseParallel does not take it: VocabParallelEmbedding below); the norms whole on every
# rank. With sequence parallelism the norms and residuals hold 1/tp of the sequence: the
# embedding's output is split over it, the attention's and the MLP's input gathered whole, o's
# and down's output reduce-scattered, and the head's input gathered.
# usage: reference_tp.py SPEC.json (distributed_common.py)
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.nn import functional as F

from distributed_common import Layout, loss_of, run


class SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) forward, identity backward: Megatron's reduce_from_region."""

    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad


class VocabParallelEmbedding(nn.Module):
    """The word table as a DTensor sharded by rows; each rank looks up the tokens in its rows
    (zeros for the others) and the ranks' lookups are summed."""

    def __init__(self, wte, mesh, rank, world):
        super().__init__()
        self.wte = nn.Parameter(distribute_tensor(wte.detach(), mesh, [Shard(0)]))
        self.rows = wte.shape[0] // world
        self.first = rank * self.rows

    def forward(self, tokens):
        local = tokens - self.first
        table = self.wte.to_local()
        mine = ((local >= 0) & (local < self.rows)).unsqueeze(-1).to(table.dtype)
        return SumOverRanks.apply(F.embedding(local.clamp(0, self.rows - 1), table) * mine)


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
    if model.embed.wte.shape[0] % world == 0:  # meshsim splits a vocabulary tp divides
        model.embed = VocabParallelEmbedding(model.embed.wte, mesh, rank, world)
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
