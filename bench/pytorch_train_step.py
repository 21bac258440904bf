#!/usr/bin/python3
"""PyTorch 1.13 reference for bench_train_step: the same GPT-2 124M training step (AdamW,
batch 4 x 64 tokens, 2 threads), written the plain way (nn.Linear, manual causal attention,
since scaled_dot_product_attention arrived in 2.0). Prints `ms_per_step=<median>` and the
individual step times."""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc1, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, H=12, V=50257, S=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(S, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT()
    with torch.no_grad():  # GPT-2 initialisation (as our engine): N(0, 0.02) weights, zero biases
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, 50257, (a.batch, a.seq))
    y = torch.randint(0, 50257, (a.batch, a.seq))
    times = []
    for step in range(a.steps + 1):  # step 0 warms up
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step > 0:
            times.append(dt * 1e3)
        print(f"pytorch step {step} loss {loss.item():.4f} {dt * 1e3:.0f} ms", flush=True)
    print(f"ms_per_step={statistics.median(times):.1f}")


if __name__ == "__main__":
    main()
