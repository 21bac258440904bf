#!/usr/bin/python3
"""Muon against a float64 PyTorch reference of the published algorithm, on the same tensors.

Runs muon_driver (our optim/muon.hpp) and recomputes its steps here, written from the published
algorithm rather than from our C++: Keller Jordan's Muon (github.com/KellerJordan/Muon, the
SGD-style momentum of its first release and of Moonlight: buf = mu buf + g, Nesterov g + mu buf),
the quintic Newton-Schulz iteration on the transposed matrix when rows > columns, Moonlight's
update scale 0.2 sqrt(max(m, n)) (arXiv 2502.16982; github.com/MoonshotAI/Moonlight) or Keller
Jordan's sqrt(max(1, m/n)), decoupled weight decay W *= 1 - lr wd; and torch.optim.AdamW itself for
the entries Muon does not take.

Asserts, after every one of the steps, for every entry: max |W_ours - W_ref| / max |W_ref - W_0|
(the error relative to how far the weights moved) <= TOL. And that the check can fail: the same
reference with Nesterov flipped, or with the other scale, is off by more than 100 TOL.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

# Float32 against float64: each Newton-Schulz step's gemms round at ~1e-7 relative, and the
# quintic's slope at zero (a = 3.4445) amplifies errors in the small singular directions up to
# a^5 ~ 480 times over 5 steps: ~5e-5 of the update in the worst direction. 2e-4 leaves 4x room
# and is still 100x below what a wrong formula gives (the sensitivity check below).
TOL = 2e-4


def newton_schulz(g, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if tall else x


def reference(meta, init, grads, nesterov, scale_kind):
    """The weights after each step, per entry, as float64 tensors."""
    ws, states = {}, {}
    for e in meta["entries"]:
        off, shape = e["offset"], e["shape"]
        size = int(np.prod(shape))
        ws[e["name"]] = torch.tensor(init[off:off + size].astype(np.float64)).reshape(shape).clone()
    adam_params = [torch.nn.Parameter(ws[e["name"]]) for e in meta["entries"] if not e["muon"]]
    adam_groups = [{"params": [p], "weight_decay": meta["weight_decay"] if e["decay"] else 0.0}
                   for p, e in zip(adam_params, [e for e in meta["entries"] if not e["muon"]])]
    adam = torch.optim.AdamW(adam_groups, lr=1.0, betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"])
    adam_of = {e["name"]: p for p, e in zip(adam_params, [e for e in meta["entries"] if not e["muon"]])}
    out = []
    for s, st in enumerate(meta["steps"]):
        lr, gs = st["lr"], st["grad_scale"]
        for e in meta["entries"]:
            off, shape = e["offset"], e["shape"]
            size = int(np.prod(shape))
            g = torch.tensor(grads[s][off:off + size].astype(np.float64)).reshape(shape) * gs
            if not e["muon"]:
                adam_of[e["name"]].grad = g
                continue
            buf = states.setdefault(e["name"], torch.zeros(shape, dtype=torch.float64))
            buf.mul_(meta["momentum"]).add_(g)
            u = g + meta["momentum"] * buf if nesterov else buf
            m, n = shape
            scale = 0.2 * math.sqrt(max(m, n)) if scale_kind == "rms_match" else math.sqrt(max(1.0, m / n))
            w = ws[e["name"]]
            w.mul_(1 - lr * meta["weight_decay"]).add_(newton_schulz(u, meta["ns_steps"]), alpha=-lr * scale)
        for group in adam.param_groups:
            group["lr"] = lr
        adam.step()
        out.append({e["name"]: (adam_of[e["name"]].detach() if not e["muon"] else ws[e["name"]]).clone()
                    for e in meta["entries"]})
    return out


def worst_error(meta, init, ours, ref):
    worst = 0.0
    for s in range(len(ref)):
        for e in meta["entries"]:
            off, shape = e["offset"], e["shape"]
            size = int(np.prod(shape))
            w0 = torch.tensor(init[off:off + size].astype(np.float64)).reshape(shape)
            got = torch.tensor(ours[s][off:off + size].astype(np.float64)).reshape(shape)
            moved = (ref[s][e["name"]] - w0).abs().max().item()
            worst = max(worst, (got - ref[s][e["name"]]).abs().max().item() / moved)
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--scale", choices=["rms_match", "shape"], required=True)
    ap.add_argument("--nesterov", type=int, choices=[0, 1], required=True)
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    subprocess.run([a.driver, a.workdir, a.scale, str(a.nesterov), a.backend], check=True)
    meta = json.load(open(os.path.join(a.workdir, "meta.json")))
    rd = lambda name: np.fromfile(os.path.join(a.workdir, name), dtype=np.float32)
    init = rd("init.f32")
    steps = len(meta["steps"])
    grads = [rd(f"grad{s}.f32") for s in range(1, steps + 1)]
    ours = [rd(f"param{s}.f32") for s in range(1, steps + 1)]
    nesterov = bool(a.nesterov)
    err = worst_error(meta, init, ours, reference(meta, init, grads, nesterov, a.scale))
    err_flip = worst_error(meta, init, ours, reference(meta, init, grads, not nesterov, a.scale))
    other = "shape" if a.scale == "rms_match" else "rms_match"
    err_scale = worst_error(meta, init, ours, reference(meta, init, grads, nesterov, other))
    print(f"muon ({a.scale}, nesterov={nesterov}, backend {a.backend}): {steps} steps, worst error / movement "
          f"{err:.3e} (tolerance {TOL:.0e}); reference with nesterov flipped: {err_flip:.3e}, with scale {other}: "
          f"{err_scale:.3e} (must exceed {100 * TOL:.0e})")
    ok = err <= TOL and err_flip > 100 * TOL and err_scale > 100 * TOL
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
