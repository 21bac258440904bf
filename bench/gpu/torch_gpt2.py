#!/usr/bin/python3
"""PyTorch on the shapes of bench_gpu (bench/gpu/run.sh): the bf16 matmul rate at n^3 and GPT-2
124M / 350M / 774M training steps (AdamW, batch B x T, tied head) on one GPU, in fp32 (TF32 off,
as exatrain's CUDA backend by default) and in bf16 autocast (PyTorch's mixed precision, the
figure exatrain's bf16 path is to be compared with). Prints lines `RESULT torch ...`.
Exits 0 with a `SKIP` line when torch or a CUDA device is missing."""
import argparse
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # PyTorch is optional on the device machine
    print(f"SKIP torch: not importable ({e})")
    sys.exit(0)

SHAPES = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "774m": (36, 1280, 20)}


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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, V=50257, S=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(S, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():  # GPT-2's initialisation (std 0.02, zero biases), as exatrain's
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def matmul_tflops(n, dtype, repeats):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def train(name, B, T, steps, bf16):
    L, C, H = SHAPES[name]
    torch.manual_seed(0)
    model = GPT(L, C, H).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    idx = torch.randint(0, 50257, (B, T + 1), device="cuda")
    times = []
    for s in range(steps + 1):  # the first: warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if s:
            times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    n = sum(p.numel() for p in model.parameters())
    print(f"RESULT torch model={name} precision={'bf16-autocast' if bf16 else 'fp32'} tokens_per_s={B * T / sec:.0f} "
          f"step_s={sec:.3f} params={n} loss={loss.item():.4f}", flush=True)
    del model, opt
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="124m,350m,774m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP torch: torch.cuda.is_available() is False")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    print(f"RESULT torch gemm bf16 {a.gemm}^3: {matmul_tflops(a.gemm, torch.bfloat16, a.repeats):.1f} TFLOP/s", flush=True)
    print(f"RESULT torch gemm fp32 {a.gemm // 2}^3 (TF32 off): "
          f"{matmul_tflops(a.gemm // 2, torch.float32, a.repeats):.1f} TFLOP/s", flush=True)
    for name in a.models.split(","):
        for bf16 in (False, True):
            train(name, a.batch, a.seq, a.steps, bf16)


if __name__ == "__main__":
    main()
