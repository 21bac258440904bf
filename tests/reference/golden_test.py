#!/usr/bin/python3
"""PyTorch golden test for one model variant.

Runs golden_driver (our engine) and recomputes the same things with PyTorch 1.13 in float64
from the same initial weights and data:
  * logits, loss and every parameter's gradient of one forward/backward, and
  * the loss curve of 10 AdamW steps (warm-up + cosine LR, global-norm clipping, weight decay
    on matrices only, 2 micro-batches of gradient accumulation per step).
Fails (exit 1) when any relative error exceeds the tolerance. The architecture below is
written independently of the C++ code from the definitions in docs/engine.md.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

TOL_FORWARD = 1e-4   # logits, loss, gradients: max |ours - torch| / max |torch| per tensor
TOL_CURVE = 1e-4     # each of the 10 training losses, relative


def load(workdir, name, dtype):
    return np.fromfile(os.path.join(workdir, name), dtype=dtype)


def norm(x, w, b, kind, eps):
    if kind == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # x [B, H, T, D], Hugging Face Llama "rotate_half" convention
    T, D = x.shape[2], x.shape[3]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def gpt_forward(P, cfg, tokens):
    """tokens [B, T] -> logits [B, T, V]."""
    Bsz, T = tokens.shape
    C, H, KV = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    D = C // H
    eps = cfg["norm_eps"]
    get = lambda n: P.get(n)
    x = P["wte.weight"][tokens]
    if cfg["position"] == "learned":
        x = x + P["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = f"h.{i}."
        h = norm(x, P[p + "ln_1.weight"], get(p + "ln_1.bias"), cfg["norm"], eps)
        q = F.linear(h, P[p + "attn.q_proj.weight"], get(p + "attn.q_proj.bias"))
        k = F.linear(h, P[p + "attn.k_proj.weight"], get(p + "attn.k_proj.bias"))
        v = F.linear(h, P[p + "attn.v_proj.weight"], get(p + "attn.v_proj.bias"))
        q = q.view(Bsz, T, H, D).transpose(1, 2)
        k = k.view(Bsz, T, KV, D).transpose(1, 2)
        v = v.view(Bsz, T, KV, D).transpose(1, 2)
        if cfg["position"] == "rope":
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(Bsz, T, H * D)
        x = x + F.linear(y, P[p + "attn.o_proj.weight"], get(p + "attn.o_proj.bias"))
        h = norm(x, P[p + "ln_2.weight"], get(p + "ln_2.bias"), cfg["norm"], eps)
        if cfg["activation"] == "gelu":
            a = F.gelu(F.linear(h, P[p + "mlp.fc1.weight"], get(p + "mlp.fc1.bias")),
                       approximate="tanh")
            x = x + F.linear(a, P[p + "mlp.fc2.weight"], get(p + "mlp.fc2.bias"))
        else:
            gate = F.linear(h, P[p + "mlp.gate_proj.weight"], get(p + "mlp.gate_proj.bias"))
            up = F.linear(h, P[p + "mlp.up_proj.weight"], get(p + "mlp.up_proj.bias"))
            x = x + F.linear(F.silu(gate) * up, P[p + "mlp.down_proj.weight"],
                             get(p + "mlp.down_proj.bias"))
    x = norm(x, P["ln_f.weight"], get("ln_f.bias"), cfg["norm"], eps)
    head = P["lm_head.weight"] if "lm_head.weight" in P else P["wte.weight"]
    return F.linear(x, head)


def expected_names(cfg):
    """The parameters the architecture has (docs/engine.md): norm biases with layernorm only,
    linear-layer biases only with bias = true, positions with learned only, lm_head untied only."""
    ln, bias = cfg["norm"] == "layernorm", cfg["bias"]
    names = {"wte.weight", "ln_f.weight"} | ({"ln_f.bias"} if ln else set())
    if cfg["position"] == "learned":
        names.add("wpe.weight")
    if not cfg["tie_embeddings"]:
        names.add("lm_head.weight")
    mlp = ["fc1", "fc2"] if cfg["activation"] == "gelu" else ["gate_proj", "up_proj", "down_proj"]
    for i in range(cfg["layers"]):
        p = f"h.{i}."
        for n in ("ln_1", "ln_2"):
            names |= {p + n + ".weight"} | ({p + n + ".bias"} if ln else set())
        for lin in [f"attn.{x}_proj" for x in "qkvo"] + [f"mlp.{x}" for x in mlp]:
            names |= {p + lin + ".weight"} | ({p + lin + ".bias"} if bias else set())
    return names


def make_params(meta, flat):
    P = {}
    for e in meta["params"]:
        a = flat[e["offset"]: e["offset"] + e["numel"]].reshape(e["shape"])
        P[e["name"]] = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    return P


def rel_err(ours, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(ours, np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


def lr_at(step, t):
    if t["warmup_steps"] > 0 and step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    if t["steps"] <= t["warmup_steps"]:
        return t["lr"]
    prog = min(1.0, (step - t["warmup_steps"]) / (t["steps"] - t["warmup_steps"]))
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * prog))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    subprocess.run([a.driver, a.variant, a.workdir], check=True)
    torch.set_num_threads(1)
    with open(os.path.join(a.workdir, "meta.json")) as f:
        meta = json.load(f)
    cfg, Bsz = meta["model"], meta["batch"]
    T, V = cfg["seq_len"], cfg["vocab"]
    flat = load(a.workdir, "params.bin", np.float32)
    failures = []

    # ---- one forward/backward ----
    P = make_params(meta, flat)
    have, want = set(P), expected_names(cfg)
    if have != want:
        failures.append(f"parameters: missing {sorted(want - have)}, unexpected {sorted(have - want)}")
    print(f"params   {len(have)} tensors, {sum(p['numel'] for p in meta['params'])} values, bias = {cfg['bias']}")
    tokens = torch.tensor(load(a.workdir, "tokens.bin", np.int32).astype(np.int64)).view(Bsz, T)
    targets = torch.tensor(load(a.workdir, "targets.bin", np.int32).astype(np.int64)).view(-1)
    logits = gpt_forward(P, cfg, tokens)
    loss = F.cross_entropy(logits.view(-1, V), targets)
    loss.backward()
    e = rel_err(load(a.workdir, "logits.bin", np.float32), logits.detach().numpy().reshape(-1))
    print(f"logits   rel err {e:.2e}")
    if e > TOL_FORWARD: failures.append(f"logits rel err {e:.2e}")
    e = abs(meta["loss"] - loss.item()) / abs(loss.item())
    print(f"loss     ours {meta['loss']:.7f} torch {loss.item():.7f} rel err {e:.2e}")
    if e > TOL_FORWARD: failures.append(f"loss rel err {e:.2e}")
    grads = load(a.workdir, "grads.bin", np.float32)
    worst = 0.0
    # The key bias gets an analytically zero gradient (softmax ignores a per-row constant), so
    # both sides hold rounding noise: errors are relative to max(|tensor|, 1e-3 * largest grad).
    floor = 1e-3 * max(float(P[p["name"]].grad.abs().max()) for p in meta["params"])
    for p in meta["params"]:
        ours = grads[p["offset"]: p["offset"] + p["numel"]]
        ref = P[p["name"]].grad.numpy().reshape(-1)
        e = float(np.max(np.abs(ours - ref))) / max(float(np.max(np.abs(ref))), floor)
        worst = max(worst, e)
        if e > TOL_FORWARD: failures.append(f"grad {p['name']} rel err {e:.2e}")
    print(f"grads    worst rel err over {len(meta['params'])} parameters {worst:.2e}")

    # ---- 10 AdamW steps ----
    t = meta["train"]
    P = make_params(meta, flat)
    # The decay set, decided here as nanoGPT does (tensors of dim >= 2: matrices and
    # embeddings; not biases or norm weights), not read from our meta.json flags; a flag that
    # disagrees is a failure of its own.
    decay = [w for w in P.values() if w.dim() >= 2]
    no_decay = [w for w in P.values() if w.dim() < 2]
    for p in meta["params"]:
        if p["decay"] != (P[p["name"]].dim() >= 2):
            failures.append(f"decay flag of {p['name']} is {p['decay']}, expected "
                            f"{P[p['name']].dim() >= 2} (dim {P[p['name']].dim()})")
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    inputs = load(a.workdir, "train_inputs.bin", np.int32).astype(np.int64)
    tgts = load(a.workdir, "train_targets.bin", np.int32).astype(np.int64)
    mb, acc = t["micro_batch"], t["grad_accum"]
    rows = mb * T
    for step, ours in enumerate(t["history"]):
        opt.zero_grad()
        total = 0.0
        for k in range(acc):
            i = (step * acc + k) * rows
            x = torch.tensor(inputs[i: i + rows]).view(mb, T)
            y = torch.tensor(tgts[i: i + rows])
            l = F.cross_entropy(gpt_forward(P, cfg, x).view(-1, V), y)
            (l / acc).backward()
            total += l.item() / acc
        gn = torch.nn.utils.clip_grad_norm_(list(P.values()), t["grad_clip"]).item()
        lr = lr_at(step, t)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        e = abs(ours["loss"] - total) / abs(total)
        print(f"step {step + 1:2d} loss ours {ours['loss']:.6f} torch {total:.6f} rel {e:.1e}"
              f"  grad_norm ours {ours['grad_norm']:.5f} torch {gn:.5f}  lr {ours['lr']:.5f}")
        if e > TOL_CURVE: failures.append(f"step {step + 1} loss rel err {e:.2e}")
        if abs(ours["lr"] - lr) > 1e-9 * lr: failures.append(f"step {step + 1} lr {ours['lr']} != {lr}")
        if abs(ours["grad_norm"] - gn) > 1e-4 * gn: failures.append(f"step {step + 1} grad_norm")
    first, last = t["history"][0]["loss"], t["history"][-1]["loss"]
    if not last < first - 0.5:
        failures.append(f"10 steps did not train: loss {first:.4f} -> {last:.4f}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"golden test {a.variant}: OK")


if __name__ == "__main__":
    main()
