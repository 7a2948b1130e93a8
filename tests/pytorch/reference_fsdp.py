# FSDP2 (torch.distributed.fsdp.fully_shard) against meshsim's ZeRO: every child of the model
# with parameters a unit of its own (meshsim's ZeRO-3 makes the same units), then the root.
# reshard_after_forward=True (the spec's "reshard": true) frees each unit's gathered
# parameters after its forward and gathers them again for backward: --zero 3. False keeps
# them from forward to backward, so parameters are sharded only between steps while
# gradients are reduce-scattered and the optimizer state sharded: --zero 2.
# usage: reference_fsdp.py SPEC.json (distributed_common.py)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from distributed_common import Layout, loss_of, run


def layout(model, spec, rank, world):
    mesh = init_device_mesh("cpu", (world,))
    reshard = bool(spec["reshard"])
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)

    def step(inputs, targets):
        loss = loss_of(model(inputs), targets)
        loss.backward()
        return loss.item()

    def full_state():
        return {k: v.full_tensor() for k, v in model.state_dict().items()}

    return Layout(step=step, parameters=list(model.parameters()), full_state=full_state,
                  modules=[model], fsdp_root=model)


if __name__ == "__main__":
    run(layout)
