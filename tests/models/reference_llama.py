# PyTorch's own build of meshsim's Llama (src/models/llama.cpp), written the way Hugging
# Face's LlamaForCausalLM computes (RMSNorm, rotate_half rotary embedding, repeat_kv for
# grouped-query attention, SwiGLU, untied head): same modules, same parameter order, same
# init (reseed, then RMSNorm weights 1 and every other weight normal(0, 0.02) in
# named_parameters() order, drawn in float32). It then runs in float64 on fixed tokens and
# prints the parameter count, the loss, every logit and every parameter's gradient (in
# parameters() order), one number per line, so the C++ test can compare.
# usage: reference_llama.py LAYERS HIDDEN HEADS KV_HEADS FFN SEQ_LEN VOCAB THETA SEED BATCH T
#            [EXPERTS TOP_K EXPERT_FFN SHARED_FFN DENSE_LAYERS AUX_LOSS] [VARIANTS...]
# VARIANTS, the ones Hugging Face configs describe (src/models/hf_config.h): --head-dim D (heads
# D wide, not HIDDEN/HEADS), --qkv-bias and --out-bias (Qwen2's and attention_bias' biases),
# --qk-norm (Qwen3's RMSNorm over each head of q and k before the rotation), --eps E (every
# RMSNorm's epsilon), --llama3 FACTOR LOW HIGH ORIGINAL (Llama 3.1's rotary scaling, as
# transformers' _compute_llama3_parameters), --no-normalize (the top k router weights kept as
# the softmax gave them, Qwen3-MoE's norm_topk_prob false), --tie (the head reads the embedding's
# wte: tie_word_embeddings).
# With the last six, every layer from DENSE_LAYERS on has a mixture of experts as its MLP
# (src/models/layers/moe.h), written as Hugging Face's MixtralSparseMoeBlock computes it
# (softmax router, top k renormalised, each expert run on the tokens that chose it), plus
# shared experts, and the loss whose gradients are printed adds each layer's balancing loss
# (Switch's, per sequence, averaged); the printed loss is the language model's alone.
import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


class Embedding(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(vocab, hidden))

    def forward(self, tokens):
        return F.embedding(tokens, self.wte)


EPS = 1e-5  # every RMSNorm's epsilon (--eps)


class RMSNorm(nn.Module):
    def __init__(self, width, eps=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = EPS if eps is None else eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama3_frequencies(inv_freq, factor, low, high, original):
    # transformers' _compute_llama3_parameters
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, inv_freq_llama)


LLAMA3 = None  # (factor, low, high, original) with --llama3


def rotary(x, theta):
    t, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
    if LLAMA3:
        inv_freq = llama3_frequencies(inv_freq, *LLAMA3)
    freqs = torch.outer(torch.arange(t, dtype=x.dtype), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


VARIANT = {"head_dim": 0, "qkv_bias": False, "out_bias": False, "qk_norm": False,
           "normalize": True, "tie": False}


class TiedHead(nn.Module):
    # logits = x @ wte^T with the embedding's own weight, which stays listed once (at embed.wte)
    def __init__(self, embed):
        super().__init__()
        self.embed = [embed]  # a list: not a child, so no second listing of its weight

    def forward(self, x):
        return x @ self.embed[0].wte.T


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, theta):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = VARIANT["head_dim"] or hidden // heads
        self.theta = theta
        bias = VARIANT["qkv_bias"]
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=VARIANT["out_bias"])
        if VARIANT["qk_norm"]:  # Qwen3Attention's q_norm and k_norm, over each head
            self.q_norm = RMSNorm(self.head_dim)
            self.k_norm = RMSNorm(self.head_dim)

    def forward(self, x):
        b, t, _ = x.shape
        d = self.head_dim
        q = self.q(x).view(b, t, self.heads, d).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, d).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, d).transpose(1, 2)
        if VARIANT["qk_norm"]:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        # Hugging Face's repeat_kv: kv head j serves query heads j*rep .. (j+1)*rep - 1.
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, rep, t, d).reshape(b, self.heads, t, d)
        v = v[:, :, None].expand(b, self.kv_heads, rep, t, d).reshape(b, self.heads, t, d)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, self.heads * d)
        return self.o(y)


class Mlp(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Moe(nn.Module):
    def __init__(self, hidden, experts, top_k, ffn, shared_ffn, aux_loss):
        super().__init__()
        self.experts, self.top_k, self.aux_loss = experts, top_k, aux_loss
        self.router = nn.Parameter(torch.empty(experts, hidden))
        self.expert_gate = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.expert_up = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.expert_down = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.shared = Mlp(hidden, shared_ffn) if shared_ffn > 0 else None
        self.balancing = None

    def forward(self, x):
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        probs = torch.softmax(flat @ self.router.T, dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if VARIANT["normalize"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            h_e = flat[token]
            y = (F.silu(h_e @ self.expert_gate[e].T) * (h_e @ self.expert_up[e].T)) @ self.expert_down[e].T
            out = out.index_add(0, token, y * weights[token, slot, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        # Switch's balancing loss per sequence: the fraction of its choices each expert got
        # times its mean router probability, summed, times E and alpha; averaged.
        f = F.one_hot(chosen.reshape(b, t * self.top_k), self.experts).sum(1).to(probs.dtype)
        f = f / (t * self.top_k)
        p = probs.reshape(b, t, self.experts).mean(1)
        self.balancing = self.aux_loss * self.experts * (f * p).sum(-1).mean()
        return out.reshape(b, t, h)


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn, theta, moe=None):
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, heads, kv_heads, theta)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = Moe(hidden, *moe) if moe else Mlp(hidden, ffn)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def build(layers, hidden, heads, kv_heads, ffn, vocab, theta, seed, moe=None, dense_layers=0):
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("embed", Embedding(vocab, hidden))
    for l in range(layers):
        model.add_module(f"block{l}", Block(hidden, heads, kv_heads, ffn, theta,
                                            moe if l >= dense_layers else None))
    model.add_module("norm_f", RMSNorm(hidden))
    if VARIANT["tie"]:
        model.add_module("head", TiedHead(model.embed))
    else:
        model.add_module("head", nn.Linear(hidden, vocab, bias=False))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-2].endswith("norm") or name.startswith("norm_f."):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model


def read_variants(args):
    global EPS, LLAMA3
    i = 0
    while i < len(args):
        flag = args[i]
        if flag == "--head-dim":
            VARIANT["head_dim"] = int(args[i + 1])
            i += 1
        elif flag in ("--qkv-bias", "--out-bias", "--qk-norm"):
            VARIANT[flag[2:].replace("-", "_")] = True
        elif flag == "--tie":
            VARIANT["tie"] = True
        elif flag == "--no-normalize":
            VARIANT["normalize"] = False
        elif flag == "--eps":
            EPS = float(args[i + 1])
            i += 1
        elif flag == "--llama3":
            LLAMA3 = tuple(float(v) for v in args[i + 1:i + 5])
            i += 4
        else:
            sys.exit("unknown variant " + flag)
        i += 1


def main():
    layers, hidden, heads, kv_heads, ffn, seq_len, vocab = map(int, sys.argv[1:8])
    theta = float(sys.argv[8])
    seed, batch, t = map(int, sys.argv[9:12])
    moe, dense_layers = None, 0
    rest = sys.argv[12:]
    if rest and not rest[0].startswith("--"):
        experts, top_k, expert_ffn, shared_ffn, dense_layers = map(int, rest[:5])
        moe = (experts, top_k, expert_ffn, shared_ffn, float(rest[5]))
        rest = rest[6:]
    read_variants(rest)
    model = build(layers, hidden, heads, kv_heads, ffn, vocab, theta, seed, moe,
                  dense_layers).double()
    tokens = torch.tensor([[(7 * b + 13 * i + 3) % vocab for i in range(t)] for b in range(batch)])
    targets = torch.tensor([[(5 * b + 11 * i + 1) % vocab for i in range(t)] for b in range(batch)])
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    balancing = sum(m.balancing for m in model.modules() if isinstance(m, Moe))
    (loss + balancing).backward()
    print(sum(p.numel() for p in model.parameters()))
    print(repr(loss.item()))
    for v in logits.detach().reshape(-1).tolist():
        print(repr(v))
    for p in model.parameters():
        for v in p.grad.reshape(-1).tolist():
            print(repr(v))


if __name__ == "__main__":  # imported by load_state_dict.py for its model
    main()
