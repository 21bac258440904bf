#!/usr/bin/python3
"""K-FAC against a float64 reference of the published algorithm, on the same tensors.

Runs kfac_driver (our optim/kfac.hpp, built from a job with --set overrides) and recomputes its
steps here, written from KAISA (Pauloski et al. 2021, arXiv 2107.01739) and its code kfac-pytorch
(KFACEigenLayer), not from our C++:
  factors on the factor steps (1, 1 + factor_update_steps, ...), over the step's N rows:
      A_new = X^T X / N,  G_new = N * DY^T DY   (get_cov(a); the batch-averaged G of a mean loss)
      A = decay A + (1 - decay) A_new (A = A_new the first time), G likewise
  eigendecompositions on the inverse steps (1, 1 + inv_update_steps, ...): torch.linalg.eigh,
      eigenvalues clamped at 0
  P = QG ((QG^T g QA) / (dG dA^T + damping)) QA^T for the matrices, g = grad_scale * grad
  KL clip: nu = min(1, sqrt(kl_clip / |sum lr^2 <P, g>|)), P = nu P
  torch.optim.SGD itself (momentum, Nesterov, weight decay on entries with decay = true) with the
  matrices' gradient replaced by P, every other entry's by g.

Asserts, after every step and for every entry: max |W_ours - W_ref| / max |W_ref - W_0| <= TOL;
and that the check can fail: the reference without preconditioning (P = g) is off by more than
100 TOL.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

# Float32 factors, eigendecompositions of them in double, float32 weights, against float64
# throughout: measured below 1e-5 relative to the movement; 2e-4 leaves room.
TOL = 2e-4


def tensors(meta, flat):
    out = {}
    for e in meta["entries"]:
        off, shape = e["offset"], e["shape"]
        size = int(np.prod(shape))
        out[e["name"]] = torch.tensor(flat[off:off + size].astype(np.float64)).reshape(shape).clone()
    return out


def observations(meta, flat):
    """{matrix name: (X [N, in], DY [N, out])} over the micro-batches of one step."""
    rows, at, parts = meta["rows"], 0, {}
    for _ in range(meta["micro_batches"]):
        for e in meta["entries"]:
            if not e["matrix"]:
                continue
            out, inn = e["shape"]
            x = flat[at:at + rows * inn].reshape(rows, inn); at += rows * inn
            dy = flat[at:at + rows * out].reshape(rows, out); at += rows * out
            xs, dys = parts.setdefault(e["name"], ([], []))
            xs.append(x), dys.append(dy)
    assert at == flat.size, (at, flat.size)
    return {k: (torch.tensor(np.concatenate(xs).astype(np.float64)), torch.tensor(np.concatenate(ds).astype(np.float64)))
            for k, (xs, ds) in parts.items()}


def reference(meta, init, grads, obs, precondition=True):
    ws = tensors(meta, init)
    params = {k: torch.nn.Parameter(v) for k, v in ws.items()}
    groups = [{"params": [params[e["name"]]], "weight_decay": meta["weight_decay"] if e["decay"] else 0.0}
              for e in meta["entries"]]
    opt = torch.optim.SGD(groups, lr=1.0, momentum=meta["momentum"], nesterov=meta["nesterov"])
    mats = [e["name"] for e in meta["entries"] if e["matrix"]]
    fac, eig = {}, {}
    out = []
    for s, st in enumerate(meta["steps"], start=1):
        if (s - 1) % meta["factor_update_steps"] == 0:
            assert st["observed"], f"step {s} is a factor step but the driver did not observe"
            f = 0.0 if s == 1 else meta["factor_decay"]
            for k, (x, dy) in obs[s].items():
                n = x.shape[0]
                a_new, g_new = x.T @ x / n, dy.T @ dy * n
                a, g = fac.get(k, (torch.zeros_like(a_new), torch.zeros_like(g_new)))
                fac[k] = (f * a + (1 - f) * a_new, f * g + (1 - f) * g_new)
        if (s - 1) % meta["inv_update_steps"] == 0:
            for k in mats:
                da, qa = torch.linalg.eigh(fac[k][0])
                dg, qg = torch.linalg.eigh(fac[k][1])
                eig[k] = (qa, da.clamp(min=0), qg, dg.clamp(min=0))
        g = {k: v * st["grad_scale"] for k, v in tensors(meta, grads[s - 1]).items()}
        pre = {}
        for k in mats:
            qa, da, qg, dg = eig[k]
            v = qg.T @ g[k] @ qa / (torch.outer(dg, da) + meta["damping"])
            pre[k] = qg @ v @ qa.T if precondition else g[k]
        nu = 1.0
        if meta["kl_clip"] > 0:
            vg = sum(float((pre[k] * g[k]).sum()) * st["lr"] ** 2 for k in mats)
            if abs(vg) > 0:
                nu = min(1.0, (meta["kl_clip"] / abs(vg)) ** 0.5)
        for k, p in params.items():
            p.grad = nu * pre[k] if k in pre else g[k]
        for group in opt.param_groups:
            group["lr"] = st["lr"]
        opt.step()
        out.append({k: p.detach().clone() for k, p in params.items()})
    return out


def worst(meta, init, ours, ref):
    w0, worst_err = tensors(meta, init), 0.0
    for s, r in enumerate(ref):
        o = tensors(meta, ours[s])
        for k in r:
            moved = float((r[k] - w0[k]).abs().max())
            worst_err = max(worst_err, float((o[k] - r[k]).abs().max()) / max(moved, 1e-30))
    return worst_err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("sets", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    subprocess.run([a.driver, a.workdir, a.backend] + a.sets, check=True)
    meta = json.load(open(os.path.join(a.workdir, "meta.json")))
    rd = lambda name: np.fromfile(os.path.join(a.workdir, name), dtype=np.float32)
    steps = len(meta["steps"])
    init = rd("init.f32")
    grads = [rd(f"grad{s}.f32") for s in range(1, steps + 1)]
    ours = [rd(f"param{s}.f32") for s in range(1, steps + 1)]
    obs = {s: observations(meta, rd(f"obs{s}.f32")) for s in range(1, steps + 1) if meta["steps"][s - 1]["observed"]}
    err = worst(meta, init, ours, reference(meta, init, grads, obs))
    plain = worst(meta, init, ours, reference(meta, init, grads, obs, precondition=False))
    print(f"kfac: worst error over movement {err:.3g} (tolerance {TOL}); unpreconditioned reference: {plain:.3g}")
    ok = err <= TOL and plain > 100 * TOL
    if not ok:
        print("FAIL: " + ("K-FAC differs from the reference" if err > TOL else
                          "the check cannot tell K-FAC from plain SGD"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
