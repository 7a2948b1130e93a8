# PyTorch's own build of meshsim's GPT (src/models/gpt.cpp): same modules, same parameter
# order, same init (reseed, then normal(0, 0.02) weights, zero biases, LayerNorm 1/0 in
# named_parameters() order). Prints the parameter count, then every logit for fixed tokens,
# one per line, so the C++ test can compare.
# usage: reference_gpt.py LAYERS HIDDEN HEADS SEQ_LEN VOCAB TIE SEED BATCH T [FFN (default 4*HIDDEN)]
import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


class Embedding(nn.Module):
    def __init__(self, vocab, hidden, seq_len):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(vocab, hidden))
        self.wpe = nn.Parameter(torch.empty(seq_len, hidden))

    def forward(self, tokens):
        return F.embedding(tokens, self.wte) + self.wpe[: tokens.shape[1]]


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        heads = q.shape[2] // self.head_dim
        split = lambda y: y.view(b, t, heads, self.head_dim).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, heads * self.head_dim)
        return self.out(y)


class Mlp(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.fc = nn.Linear(hidden, ffn)
        self.proj = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = Mlp(hidden, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TiedHead(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.embed = [embed]  # a list, so it is not a second child

    def forward(self, x):
        return F.linear(x, self.embed[0].wte)


def build(layers, hidden, heads, seq_len, vocab, tie, seed, ffn):
    torch.manual_seed(seed)
    model = nn.Sequential()
    embed = Embedding(vocab, hidden, seq_len)
    model.add_module("embed", embed)
    for l in range(layers):
        model.add_module(f"block{l}", Block(hidden, heads, ffn))
    model.add_module("ln_f", nn.LayerNorm(hidden))
    model.add_module("head", TiedHead(embed) if tie else nn.Linear(hidden, vocab, bias=False))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.split(".")[-2]
            if module.startswith("ln"):
                p.fill_(1.0) if name.endswith(".weight") else p.zero_()
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
    return model


def main():
    layers, hidden, heads, seq_len, vocab, tie, seed, batch, t = map(int, sys.argv[1:10])
    ffn = int(sys.argv[10]) if len(sys.argv) > 10 else 4 * hidden
    model = build(layers, hidden, heads, seq_len, vocab, bool(tie), seed, ffn)
    tokens = torch.tensor([[(7 * b + 13 * i + 3) % vocab for i in range(t)] for b in range(batch)])
    with torch.no_grad():
        logits = model(tokens)
    print(sum(p.numel() for p in model.parameters()))
    for v in logits.reshape(-1).tolist():
        print(repr(v))


if __name__ == "__main__":  # imported by load_state_dict.py for its model
    main()
