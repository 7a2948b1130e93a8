# Loads a folder written by `meshsim export RUN --hf DIR` with transformers'
# AutoModelForCausalLM.from_pretrained and computes the mean cross-entropy of its next-token
# predictions on a data set, in float32 (as meshsim trains) and in float64; and loads the same
# run's `--state-dict` export into PyTorch's own twin of meshsim's model (reference_gpt.py,
# reference_llama.py) and computes the float64 logits again. Prints one JSON line per job.
#
# usage: hf_check.py JOBS.json
#   a list of {"hf": DIR, "state_dict": FILE, "data": FILE, "model": "gpt"|"llama",
#              "shape": [reference build arguments], "resave": DIR (optional)}
#   resave: the float32 model is saved there again by transformers' save_pretrained
#   data: a torch.load-able dict with "inputs" [N, T] and "targets" [N, T] (next tokens)
#   gpt shape:   LAYERS HIDDEN HEADS SEQ_LEN VOCAB TIE FFN
#   llama shape: LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB THETA
import json
import os
import sys

import torch
from torch.nn import functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "models"))


def reference(model, shape):
    if model == "gpt":
        import reference_gpt
        layers, hidden, heads, seq_len, vocab, tie, ffn = map(int, shape)
        return reference_gpt.build(layers, hidden, heads, seq_len, vocab, bool(tie), 0, ffn)
    import reference_llama
    layers, hidden, heads, kv_heads, ffn, vocab = map(int, shape[:6])
    return reference_llama.build(layers, hidden, heads, kv_heads, ffn, vocab, float(shape[6]), 0)


def in_float64(model):
    """transformers computes two parts of the Llama in float32 whatever the model's dtype: its
    RMSNorm (LlamaRMSNorm.forward casts to float32) and its rotary tables
    (LlamaRotaryEmbedding.forward casts to float). For the float64 comparison both run in
    float64, by the same formulas, with the eps and theta the model read from config.json."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None:
        return
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            def norm(x, m=module):
                return m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
            module.forward = norm
    theta = model.config.rope_parameters["rope_theta"]
    d = model.config.head_dim

    def forward(x, position_ids):
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        freqs = position_ids.double()[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rotary.forward = forward


def load_hf(folder, dtype):
    from transformers import AutoModelForCausalLM
    # sdpa: eager attention takes its softmax in float32 whatever the model's dtype
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa",
                                                       output_loading_info=True)
    problems = {k: sorted(map(str, v)) for k, v in info.items() if v}
    return model.eval(), problems


def mean_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()


def check(job):
    data = torch.load(job["data"], weights_only=False)
    inputs, targets = data["inputs"], data["targets"]
    out = {}
    with torch.no_grad():
        hf32, problems = load_hf(job["hf"], torch.float32)
        hf64, _ = load_hf(job["hf"], torch.float64)
        in_float64(hf64)
        if job.get("resave"):  # transformers' own writer, for meshsim's reader
            hf32.save_pretrained(job["resave"])
        out["loading_problems"] = problems
        out["architecture"] = type(hf32).__name__
        out["dtype"] = str(next(hf32.parameters()).dtype)
        logits32 = hf32(input_ids=inputs).logits
        logits64 = hf64(input_ids=inputs).logits
        ref = reference(job["model"], job["shape"])
        ref.load_state_dict(torch.load(job["state_dict"], weights_only=False), strict=True)
        ref64 = ref.double().eval()(inputs)
    out["hf32"] = mean_loss(logits32, targets)
    out["hf64"] = mean_loss(logits64, targets)
    out["ref64"] = mean_loss(ref64, targets)
    out["logits_ref64_vs_hf64"] = (ref64 - logits64).abs().max().item()
    out["logits_hf32_vs_hf64"] = (logits32.double() - logits64).abs().max().item()
    out["max_abs_logit"] = logits64.abs().max().item()
    out["tokens"] = targets.numel()
    return out


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        print(json.dumps(check(job)), flush=True)


main()
