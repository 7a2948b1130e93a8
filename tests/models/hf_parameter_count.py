# Parameter counts of Hugging Face config.json files as transformers builds them: each file's
# model made on the meta device (AutoModelForCausalLM.from_config, no weights, no memory), its
# parameters counted, and its active parameters (one token's: every parameter less, in each
# mixture-of-experts block, the routed experts it does not visit). Prints "total active" per
# file, one line each, in the order given. Needs transformers (and torch).
# usage: hf_parameter_count.py CONFIG.json...
import json
import os
import shutil
import sys
import tempfile

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def experts_and_top_k(config):
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if getattr(config, key, None):
            return getattr(config, key), config.num_experts_per_tok
    return 0, 0


# Keys that say where remote code lives and how a checkpoint's weights are stored (DeepSeek-V3's
# auto_map and FP8 quantization_config): transformers would fetch the code or quantize the
# model; meshsim's parser reads them as metadata. Neither changes the parameters.
STORAGE_KEYS = ("auto_map", "quantization_config")


def counts(path):
    folder = tempfile.mkdtemp()
    try:
        with open(path) as f:
            config = json.load(f)
        for key in STORAGE_KEYS:
            config.pop(key, None)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        config = AutoConfig.from_pretrained(folder)
    finally:
        shutil.rmtree(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    experts, top_k = experts_and_top_k(config)
    idle = 0
    if experts:
        for module in model.modules():
            routed = getattr(module, "experts", None)
            if isinstance(routed, torch.nn.Module):
                whole = sum(p.numel() for p in routed.parameters())
                assert whole % experts == 0, (type(routed).__name__, whole, experts)
                idle += whole // experts * (experts - top_k)
    return total, total - idle


def main():
    for path in sys.argv[1:]:
        total, active = counts(path)
        print(total, active)


if __name__ == "__main__":
    main()
