# transformers' own DeepseekV3ForCausalLM as the reference of meshsim's DeepSeek-V3 (multi-head
# latent attention, YaRN, the sigmoid router over groups of experts, shared experts, dense
# first layers): the model of CONFIG.json built in float64 with eager attention, meshsim's
# parameters (WEIGHTS.safetensors, named as meshsim names them, their order in its metadata) copied in, run on the fixed
# tokens the C++ test uses, and the loss, every logit and every gradient printed, one number a
# line, the gradients in the file's order and meshsim's shapes.
# usage: hf_deepseek_reference.py CONFIG.json WEIGHTS.safetensors BATCH T
import json
import os
import re
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForCausalLM

ATTENTION = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
             "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj",
             "o": "o_proj"}
MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def transformers_place(name, ffn):
    """(transformers' parameter name, the slice of it meshsim's tensor is) for meshsim's name."""
    if name == "embed.wte":
        return "model.embed_tokens.weight", None
    if name == "norm_f.weight":
        return "model.norm.weight", None
    if name == "head.weight":
        return "lm_head.weight", None
    block, rest = re.fullmatch(r"block(\d+)\.(.+)", name).groups()
    layer = f"model.layers.{block}."
    if rest == "attn_norm.weight":
        return layer + "input_layernorm.weight", None
    if rest == "mlp_norm.weight":
        return layer + "post_attention_layernorm.weight", None
    part, leaf = rest.split(".", 1)
    if part == "attn":
        module, tensor = leaf.split(".")
        return layer + f"self_attn.{ATTENTION[module]}.{tensor}", None
    # The feed-forward: a dense MLP, or the mixture (router, stacked experts, shared experts).
    if leaf == "router":
        return layer + "mlp.gate.weight", None
    if leaf == "expert_gate":
        return layer + "mlp.experts.gate_up_proj", slice(0, ffn)
    if leaf == "expert_up":
        return layer + "mlp.experts.gate_up_proj", slice(ffn, 2 * ffn)
    if leaf == "expert_down":
        return layer + "mlp.experts.down_proj", None
    if leaf.startswith("shared."):
        module = leaf.split(".")[1]
        return layer + f"mlp.shared_experts.{MLP[module]}.weight", None
    module = leaf.split(".")[0]
    return layer + f"mlp.{MLP[module]}.weight", None


def main():
    config_path, weights_path = sys.argv[1:3]
    batch, t = map(int, sys.argv[3:5])
    folder = tempfile.mkdtemp()
    try:
        shutil.copy(config_path, os.path.join(folder, "config.json"))
        config = AutoConfig.from_pretrained(folder)
    finally:
        shutil.rmtree(folder)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the loop over experts: grouped_mm has no float64
    model = AutoModelForCausalLM.from_config(config).double()
    ffn = config.moe_intermediate_size
    params = dict(model.named_parameters())
    with safe_open(weights_path, framework="pt") as f:
        order = f.metadata()["order"].split(",")  # meshsim's parameter order
        weights = {name: f.get_tensor(name) for name in order}
    places = {}
    with torch.no_grad():
        for name, value in weights.items():
            target, part = transformers_place(name, ffn)
            places[name] = (target, part)
            (params[target][:, part] if part else params[target]).copy_(value)
    assert sum(p.numel() for p in params.values()) == sum(v.numel() for v in weights.values())
    vocab = config.vocab_size
    tokens = torch.tensor([[(7 * b + 13 * i + 3) % vocab for i in range(t)] for b in range(batch)])
    targets = torch.tensor([[(5 * b + 11 * i + 1) % vocab for i in range(t)] for b in range(batch)])
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    print(repr(loss.item()))
    for x in logits.detach().reshape(-1).tolist():
        print(repr(x))
    for name in weights:
        target, part = places[name]
        grad = params[target].grad
        for x in (grad[:, part] if part else grad).reshape(-1).tolist():
            print(repr(x))


if __name__ == "__main__":
    main()
