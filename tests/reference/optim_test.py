#!/usr/bin/python3
"""SGD, Lion, LAMB, Adafactor, Shampoo and SOAP against float64 references on the same tensors.

Runs optim_driver (our optim/first_order.hpp, built from a job with --set overrides) and recomputes
its steps here: torch.optim.SGD itself for SGD; for the others (not in Debian's PyTorch 1.13) a
short reference written from the published algorithm, not from our C++:
  Lion: Chen et al. 2023, arXiv 2302.06675, Algorithm 2 (decoupled weight decay).
  LAMB: You et al. 2019, arXiv 1904.00962, Algorithm 2 (Adam's bias-corrected direction plus
        weight decay, trust ratio |w| / |r| per tensor, 1 when either norm is 0).
  Adafactor: Shazeer & Stern 2018, arXiv 1804.04235, as Hugging Face's Adafactor with
        relative_step = scale_parameter = False (row/column means of g^2 + eps1 for tensors of 2
        or more dimensions, update clipping by RMS, lr times the update, optional first moment of it).
  Shampoo: blocked Kronecker factors, inverse 4th roots by eigendecomposition (torch.linalg.eigh),
        layer-wise Adam grafting (Gupta et al. 2018; Anil et al. 2020; Agarwal et al. 2020).
  SOAP: Adam in the eigenbasis of Shampoo's factors (Vyas et al. 2024, arXiv 2409.11321, its soap.py).
Weight decay applies only to the entries with decay = true.

Asserts, after every step and for every entry: max |W_ours - W_ref| / max |W_ref - W_0| <= TOL;
and that the check can fail: a reference with one thing changed (SGD: Nesterov flipped; Lion: the
betas swapped; LAMB: no trust ratio; Adafactor: factoring flipped; Shampoo: no grafting; SOAP: no
rotation) is off by
more than 100 TOL.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

# Float32 against float64: the error is the rounding of the float32 weights (an ulp of |w| per
# step) against how far they moved in 6 steps: measured 3e-7 to 4e-5 (largest for LAMB, whose
# steps scale with |w|, and for a clipped Adafactor). 2e-4 leaves room and is still 100x below
# what a changed formula gives (checked below: 0.47 and more).
TOL = 2e-4


def tensors(meta, flat):
    out = {}
    for e in meta["entries"]:
        off, shape = e["offset"], e["shape"]
        size = int(np.prod(shape))
        out[e["name"]] = torch.tensor(flat[off:off + size].astype(np.float64)).reshape(shape).clone()
    return out


def sgd_reference(meta, init, grads, variant):
    ws = tensors(meta, init)
    params = {k: torch.nn.Parameter(v) for k, v in ws.items()}
    nesterov = meta["sgd"]["nesterov"] != variant
    groups = [{"params": [params[e["name"]]], "weight_decay": meta["weight_decay"] if e["decay"] else 0.0}
              for e in meta["entries"]]
    opt = torch.optim.SGD(groups, lr=1.0, momentum=meta["sgd"]["momentum"], nesterov=nesterov)
    out = []
    for s, st in enumerate(meta["steps"]):
        g = tensors(meta, grads[s])
        for k, p in params.items():
            p.grad = g[k] * st["grad_scale"]
        for group in opt.param_groups:
            group["lr"] = st["lr"]
        opt.step()
        out.append({k: p.detach().clone() for k, p in params.items()})
    return out


def lion_step(w, m, g, lr, wd, b1, b2):
    c = b1 * m + (1 - b1) * g
    w.mul_(1 - lr * wd).add_(torch.sign(c), alpha=-lr)
    m.mul_(b2).add_(g, alpha=1 - b2)


def lamb_step(w, state, g, lr, wd, meta, t, variant):
    m, v = state.setdefault("m", torch.zeros_like(w)), state.setdefault("v", torch.zeros_like(w))
    b1, b2 = meta["beta1"], meta["beta2"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    r = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + meta["eps"]) + wd * w
    wn, rn = w.norm().item(), r.norm().item()
    trust = wn / rn if wn > 0 and rn > 0 and not variant else 1.0
    w.add_(r, alpha=-lr * trust)


def adafactor_step(w, state, g, lr, wd, a, t, variant):
    factored = (a["factored"] != variant) and w.dim() >= 2
    b2t = 1.0 - t ** a["decay_rate"]
    sq = g * g + a["eps1"]
    if factored:
        row = state.setdefault("row", torch.zeros(w.shape[0], dtype=w.dtype))
        col = state.setdefault("col", torch.zeros(w.shape[1], dtype=w.dtype))
        row.mul_(b2t).add_(sq.mean(dim=-1), alpha=1 - b2t)
        col.mul_(b2t).add_(sq.mean(dim=-2), alpha=1 - b2t)
        u = g * (row / row.mean()).rsqrt().unsqueeze(-1) * col.unsqueeze(-2).rsqrt()
    else:
        v = state.setdefault("v", torch.zeros_like(w))
        v.mul_(b2t).add_(sq, alpha=1 - b2t)
        u = g * v.rsqrt()
    rms = u.norm().item() / math.sqrt(u.numel())
    u = u / max(1.0, rms / a["clip_threshold"]) * lr
    if a["beta1"] > 0:
        m = state.setdefault("m", torch.zeros_like(w))
        m.mul_(a["beta1"]).add_(u, alpha=1 - a["beta1"])
        u = m
    w.add_(w, alpha=-wd * lr).sub_(u)


def inverse_root(a, eps, p):
    lam, q = torch.linalg.eigh(a)
    return q @ torch.diag((lam.clamp(min=0) + eps) ** (-1.0 / p)) @ q.T


def shampoo_step(w, state, g, lr, wd, meta, t, variant):
    """Blocked Shampoo with layer-wise Adam grafting (optim/shampoo.hpp's docs, from Gupta et al. 2018,
    Anil et al. 2020, Agarwal et al. 2020); AdamW (torch.optim.AdamW's formula) for 1-D tensors.
    variant: no grafting (Shampoo's own step size)."""
    sh, b1, b2, eps = meta["shampoo"], meta["beta1"], meta["beta2"], meta["eps"]
    m, v = state.setdefault("m", torch.zeros_like(w)), state.setdefault("v", torch.zeros_like(w))
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    mhat = m / (1 - b1 ** t)
    adam = mhat / ((v / (1 - b2 ** t)).sqrt() + eps)
    d = adam
    since = t - sh["start_preconditioning_step"]
    if w.dim() == 2:
        B, f = sh["max_preconditioner_dim"], sh["factor_decay"]
        blocks = [(r0, c0) for r0 in range(0, w.shape[0], B) for c0 in range(0, w.shape[1], B)]
        s = torch.zeros_like(w)
        for r0, c0 in blocks:
            gb = g[r0:r0 + B, c0:c0 + B]
            L = state.setdefault(("L", r0, c0), torch.zeros(gb.shape[0], gb.shape[0], dtype=w.dtype))
            R = state.setdefault(("R", r0, c0), torch.zeros(gb.shape[1], gb.shape[1], dtype=w.dtype))
            L.mul_(f).add_(gb @ gb.T, alpha=1 - f)
            R.mul_(f).add_(gb.T @ gb, alpha=1 - f)
            if since >= 0 and since % sh["precondition_frequency"] == 0:
                state[("Lr", r0, c0)] = inverse_root(L, sh["epsilon"], 4)
                state[("Rr", r0, c0)] = inverse_root(R, sh["epsilon"], 4)
            if ("Lr", r0, c0) in state:
                s[r0:r0 + B, c0:c0 + B] = state[("Lr", r0, c0)] @ mhat[r0:r0 + B, c0:c0 + B] @ state[("Rr", r0, c0)]
        if since >= 0 and s.norm() > 0:
            d = s if variant else s * (adam.norm() / s.norm())
    w.mul_(1 - lr * wd).sub_(d, alpha=lr)


def soap_step(w, state, g, lr, wd, meta, t, variant):
    """SOAP (Vyas et al. 2024, arXiv 2409.11321, as its reference soap.py with precondition_1d off):
    Adam in the eigenbasis of Shampoo's factors, the bases refreshed every precondition_frequency
    steps by one power-iteration step and a QR, the first step spent on the factors and first bases.
    soap.py rotates the first moment out of and back into the basis at every step; that is the
    identity unless the basis changed, so it is done here only at a refresh.
    variant: Adam in the parameters' own basis (the bases never used)."""
    sp, b1, b2, eps = meta["soap"], meta["beta1"], meta["beta2"], meta["eps"]
    f, D = sp["factor_decay"], sp["max_preconditioner_dim"]
    m, v = state.setdefault("m", torch.zeros_like(w)), state.setdefault("v", torch.zeros_like(w))
    sides = [d for d in (0, 1) if w.dim() == 2 and w.shape[d] <= D]  # 0: L = g g^T, 1: R = g^T g

    def rotate(x, to_basis):
        for d in sides:
            q = state[("Q", d)] if to_basis else state[("Q", d)].T
            x = q.T @ x if d == 0 else x @ q
        return x

    def update_factors():
        for d in sides:
            outer = g @ g.T if d == 0 else g.T @ g
            state.setdefault(("GG", d), torch.zeros_like(outer)).mul_(f).add_(outer, alpha=1 - f)

    if t == 1:
        update_factors()
        for d in sides:
            state[("Q", d)] = torch.linalg.eigh(state[("GG", d)])[1].flip(1)  # eigenvalues descending
        return
    k = t - 1
    gt = rotate(g, True) if not variant else g
    m.mul_(b1).add_(gt, alpha=1 - b1)
    v.mul_(b2).addcmul_(gt, gt, value=1 - b2)
    n = m / (v.sqrt() + eps)
    w.sub_(rotate(n, False) if not variant else n, alpha=lr * math.sqrt(1 - b2 ** k) / (1 - b1 ** k))
    w.mul_(1 - lr * wd)
    update_factors()
    if variant or not sides or k % sp["precondition_frequency"] != 0:
        return
    plain = rotate(m, False)
    for d in sides:
        a, q = state[("GG", d)], state[("Q", d)]
        order = torch.sort(torch.diag(q.T @ a @ q), descending=True, stable=True).indices
        v.copy_(v.index_select(d, order))
        state[("Q", d)] = torch.linalg.qr(a @ q[:, order])[0]
    m.copy_(rotate(plain, True))


def reference(meta, init, grads, variant):
    """The weights after each step, per entry; variant: the one-thing-changed reference."""
    if meta["optimizer"] == "sgd":
        return sgd_reference(meta, init, grads, variant)
    ws, states, out = tensors(meta, init), {}, []
    lion = meta["lion"]
    b1, b2 = (lion["beta2"], lion["beta1"]) if variant else (lion["beta1"], lion["beta2"])
    for s, st in enumerate(meta["steps"]):
        g, lr, t = tensors(meta, grads[s]), st["lr"], s + 1
        for e in meta["entries"]:
            k = e["name"]
            wd = meta["weight_decay"] if e["decay"] else 0.0
            gk = g[k] * st["grad_scale"]
            state = states.setdefault(k, {})
            if meta["optimizer"] == "lion":
                lion_step(ws[k], state.setdefault("m", torch.zeros_like(ws[k])), gk, lr, wd, b1, b2)
            elif meta["optimizer"] == "lamb":
                lamb_step(ws[k], state, gk, lr, wd, meta, t, variant)
            elif meta["optimizer"] == "shampoo":
                shampoo_step(ws[k], state, gk, lr, wd, meta, t, variant)
            elif meta["optimizer"] == "soap":
                soap_step(ws[k], state, gk, lr, wd, meta, t, variant)
            else:
                adafactor_step(ws[k], state, gk, lr, wd, meta["adafactor"], t, variant)
        out.append({k: w.clone() for k, w in ws.items()})
    return out


def worst_error(meta, init, ours, ref):
    worst = 0.0
    w0 = tensors(meta, init)
    for s in range(len(ref)):
        got = tensors(meta, ours[s])
        for k in w0:
            moved = (ref[s][k] - w0[k]).abs().max().item()
            off = (got[k] - ref[s][k]).abs().max().item()
            # A step that leaves the weights (SOAP's first) must leave them exactly.
            worst = max(worst, off / moved if moved > 0 else (0.0 if off == 0 else math.inf))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("sets", nargs="+", help="section.key=value overrides of the job (train.optimizer=...)")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    subprocess.run([a.driver, a.workdir, a.backend] + a.sets, check=True)
    meta = json.load(open(os.path.join(a.workdir, "meta.json")))
    rd = lambda name: np.fromfile(os.path.join(a.workdir, name), dtype=np.float32)
    init = rd("init.f32")
    steps = len(meta["steps"])
    grads = [rd(f"grad{s}.f32") for s in range(1, steps + 1)]
    ours = [rd(f"param{s}.f32") for s in range(1, steps + 1)]
    err = worst_error(meta, init, ours, reference(meta, init, grads, False))
    err_variant = worst_error(meta, init, ours, reference(meta, init, grads, True))
    print(f"{meta['optimizer']} ({' '.join(a.sets)}, backend {a.backend}): {steps} steps, worst error / movement "
          f"{err:.3e} (tolerance {TOL:.0e}); the changed reference: {err_variant:.3e} (must exceed {100 * TOL:.0e})")
    ok = err <= TOL and err_variant > 100 * TOL
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
