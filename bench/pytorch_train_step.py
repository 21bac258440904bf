#!/usr/bin/python3
"""PyTorch 1.13 reference for bench_train_step: the same GPT-2 124M training step (AdamW,
batch 4 x 64 tokens, 2 threads), written the plain way (nn.Linear, manual causal attention,
since scaled_dot_product_attention arrived in 2.0).

Data: the token file (raw little-endian int32) that bench_train_step writes, batched exactly as
exatrain's InMemoryTokenStream (sequence b of a batch = tokens[pos : pos+T+1], pos advancing by
T per sequence, wrapping), so both sides train on the same batches in the same order.

--serve: a persistent worker driven round by round over stdin/stdout. After building the model
it prints `ready`; each line `steps N` runs N steps and prints one line per step and then
`round_ms=<ms>,<ms>,...`; `quit` (or end of input) exits. Without --serve it runs --steps steps
after one warm-up step and prints `ms_per_step=<median>`.

--bf16: the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's CPU
mixed precision: linear/matmul in bf16 with fp32 accumulation, layer norm, softmax and the loss in
fp32, fp32 parameters, gradients and AdamW state), against exatrain's precision = "bf16"."""
import argparse
import math
import statistics
import sys
import time

import numpy as np
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


class TokenStream:
    """Mirror of exatrain::InMemoryTokenStream::next_batch."""

    def __init__(self, path):
        self.tokens = np.fromfile(path, dtype="<i4").astype(np.int64)
        self.pos = 0

    def next_batch(self, B, T):
        n = len(self.tokens)
        x = np.empty((B, T), np.int64)
        y = np.empty((B, T), np.int64)
        for b in range(B):
            idx = (self.pos + np.arange(T + 1)) % n
            x[b], y[b] = self.tokens[idx[:-1]], self.tokens[idx[1:]]
            self.pos = (self.pos + T) % n
        return torch.from_numpy(x), torch.from_numpy(y)


class Runner:
    def __init__(self, a):
        torch.set_num_threads(a.threads)
        torch.manual_seed(0)
        self.a = a
        self.model = GPT()
        with torch.no_grad():  # GPT-2 initialisation (as our engine): N(0, 0.02), zero biases
            for name, p in self.model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                elif name.endswith("bias"):
                    p.zero_()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                                     weight_decay=0.1)
        self.data = TokenStream(a.tokens)
        self.step = 0

    def run(self, n):
        times = []
        for _ in range(n):
            x, y = self.data.next_batch(self.a.batch, self.a.seq)
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.a.bf16):
                loss = self.model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            dt = (time.perf_counter() - t0) * 1e3
            times.append(dt)
            batch_sum = int(x.sum()) + int(y.sum())
            print(f"pytorch step {self.step} loss {loss.item():.4f} batch_sum {batch_sum} "
                  f"{dt:.0f} ms", flush=True)
            self.step += 1
        return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", required=True, help="raw int32 token file")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="autocast to bfloat16 (CPU mixed precision)")
    a = ap.parse_args()
    r = Runner(a)
    if not a.serve:
        r.run(1)  # warm-up
        print(f"ms_per_step={statistics.median(r.run(a.steps)):.1f}")
        return
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["steps"] and len(words) == 2:
            times = r.run(int(words[1]))
            print("round_ms=" + ",".join(f"{t:.1f}" for t in times), flush=True)
        elif words[:1] == ["quit"]:
            return
        else:
            print(f"error: unknown command {line.strip()!r} (steps N | quit)", flush=True)
            sys.exit(2)


if __name__ == "__main__":
    main()
