#!/usr/bin/python3
"""The optimizer study of issue 10 (docs/optimizers.md, "Benchmark"): a learning-rate sweep per
optimizer at one seed, then more seeds at each optimizer's best lr, on bench/optim/study.toml
under `mpirun -np DP`; the target is AdamW's final validation loss at its best lr (mean over its
seeds). Reports, per optimizer at its best lr: final validation loss (mean and range over seeds),
steps and seconds to the target (the first evaluation at or below it), seconds per step, the
optimizer's share of the step, and its state; writes results.json, table.md and one SVG chart
(validation loss against steps and against seconds, every optimizer).

Usage: bench/optim/run_study.py [--build build] [--out bench/optim/results] [--quick]
  --quick: 2 optimizers, 2 lrs, 1 extra seed, 30 steps: checks the pipeline in about a minute.
The full study (8 optimizers x 4 lrs + 2 seeds x 8, 400 steps at dp 2) is sized for about two
hours on 2 cores.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

# Each optimizer's lr grid: 4 values around the scale of its update (docs/tutorial/10-optimizers.md:
# SGD's step is the raw gradient, Lion's a sign, Muon's and SOAP's match AdamW's RMS).
GRIDS = {
    "adamw": [3e-4, 1e-3, 3e-3, 1e-2],
    "sgd": [0.1, 0.3, 1.0, 3.0],
    "lion": [3e-5, 1e-4, 3e-4, 1e-3],
    "lamb": [3e-3, 1e-2, 3e-2, 1e-1],
    "adafactor": [3e-3, 1e-2, 3e-2, 1e-1],
    "muon": [3e-4, 1e-3, 3e-3, 1e-2],
    "shampoo": [3e-4, 1e-3, 3e-3, 1e-2],
    "soap": [3e-4, 1e-3, 3e-3, 1e-2],
}
# The matrix optimizers on the layers' matrices with AdamW elsewhere (optim/mixed.hpp), their
# preconditioners refreshed every 10 steps from step 10.
EXTRA = {
    "shampoo": ["optimizer.others=adamw", "optimizer.precondition_frequency=10", "optimizer.start_preconditioning_step=10"],
    "soap": ["optimizer.others=adamw", "optimizer.precondition_frequency=10"],
}
SEEDS = [1, 2, 3]


def run(args, optimizer, lr, seed):
    """One training run; returns its metrics records (cached: a finished run is not repeated)."""
    name = f"{optimizer}-lr{lr:g}-s{seed}"
    run_dir = os.path.abspath(os.path.join(args.out, "runs", name))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(os.path.join(run_dir, "DONE")):
        subprocess.run(["rm", "-rf", run_dir], check=True)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.dp),
               os.path.join(args.build, "exatrain"), "train", args.job,
               "--set", f"train.optimizer={optimizer}", "--set", f"train.lr={lr}", "--set", f"train.seed={seed}",
               "--set", f"train.steps={args.steps}", "--set", f"train.run_dir={run_dir}"]
        for s in EXTRA.get(optimizer, []):
            cmd += ["--set", s]
        t0 = time.time()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:  # a diverged run (non-finite loss) counts as a failed lr, not a failed study
            print(f"  {name}: exit {r.returncode}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")
        print(f"  {name}: {time.time() - t0:.0f} s")
        os.makedirs(run_dir, exist_ok=True)
        open(os.path.join(run_dir, "DONE"), "w").write(str(r.returncode))
    if not os.path.exists(metrics):
        return []
    return [json.loads(l) for l in open(metrics)]


def summary(records):
    """Validation curve [(step, seconds so far, val_loss)], seconds per step, optimizer seconds per
    step (the slowest rank's), rank 0's accounted bytes (weights, gradients, optimizer state,
    activations: only the state differs between optimizers)."""
    steps = {r["step"]: r for r in records if "loss" in r}
    curve, elapsed, t = [], 0.0, 0
    for r in records:
        if "loss" in r:
            elapsed += r["seconds"]
        elif "val_loss" in r and math.isfinite(r["val_loss"]):
            curve.append((r["step"], elapsed, r["val_loss"]))
    n = max(1, len(steps))
    per_step = sum(r["seconds"] for r in steps.values()) / n
    opt = sum(max(b["optimizer"] for b in r["breakdown_s_per_rank"]) for r in steps.values()) / n
    held = max((r.get("accounted_bytes", 0) for r in steps.values()), default=0)
    return curve, per_step, opt, held


def to_target(curve, target):
    for step, seconds, loss in curve:
        if loss <= target:
            return step, seconds
    return None, None


def svg_chart(series, target, path):
    """Two panels: validation loss against steps and against seconds; one polyline per optimizer."""
    W, H, pad = 460, 300, 50
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    losses = [l for c in series.values() for _, _, l in c]
    lo, hi = min(losses + [target]), max(losses)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 40}" font-family="sans-serif" font-size="11">']
    for panel, (key, label) in enumerate([(0, "optimizer steps"), (1, "seconds")]):
        x0 = panel * W
        xmax = max(p[key] for c in series.values() for p in c) or 1
        sx = lambda v: x0 + pad + (W - 2 * pad) * v / xmax
        sy = lambda v: H - pad + (2 * pad - H) * (v - lo) / ((hi - lo) or 1)
        out.append(f'<line x1="{x0 + pad}" y1="{H - pad}" x2="{x0 + W - pad}" y2="{H - pad}" stroke="black"/>')
        out.append(f'<line x1="{x0 + pad}" y1="{pad}" x2="{x0 + pad}" y2="{H - pad}" stroke="black"/>')
        out.append(f'<text x="{x0 + W / 2}" y="{H - pad + 30}" text-anchor="middle">{label} (max {xmax:.4g})</text>')
        out.append(f'<text x="{x0 + 5}" y="{pad - 10}">validation loss ({lo:.3f} to {hi:.3f})</text>')
        out.append(f'<line x1="{x0 + pad}" y1="{sy(target):.1f}" x2="{x0 + W - pad}" y2="{sy(target):.1f}" '
                   f'stroke="gray" stroke-dasharray="4 3"/>')
        for i, (name, c) in enumerate(series.items()):
            pts = " ".join(f"{sx(p[key]):.1f},{sy(p[2]):.1f}" for p in c)
            out.append(f'<polyline fill="none" stroke="{colors[i % 8]}" stroke-width="1.5" points="{pts}"/>')
            if panel == 0:
                out.append(f'<text x="{x0 + W - pad - 90}" y="{pad + 14 * i}" fill="{colors[i % 8]}">{name}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/optim/results")
    ap.add_argument("--job", default="bench/optim/study.toml")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    grids, seeds = GRIDS, SEEDS
    if a.quick:
        grids = {o: GRIDS[o][1:3] for o in ("adamw", "soap")}
        seeds, a.steps = SEEDS[:2], 30
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for o, grid in grids.items():
        print(f"{o}: lr sweep {grid}")
        finals = {}
        for lr in grid:
            curve = summary(run(a, o, lr, seeds[0]))[0]
            finals[lr] = curve[-1][2] if curve and curve[-1][0] == a.steps else math.inf
        best = min(finals, key=finals.get)
        runs = [summary(run(a, o, best, s)) for s in seeds]
        results[o] = {"sweep": finals, "best_lr": best, "runs": runs}
    adamw = [r[0][-1][2] for r in results["adamw"]["runs"] if r[0]]
    target = sum(adamw) / len(adamw)
    table(results, target, a)
    svg_chart({o: r["runs"][0][0] for o, r in results.items() if r["runs"][0][0]}, target,
              os.path.join(a.out, "optimizers.svg"))
    json.dump({"target": target, "steps": a.steps, "dp": a.dp,
               "results": {o: {"sweep": {str(k): v for k, v in r["sweep"].items()}, "best_lr": r["best_lr"],
                               "runs": r["runs"]} for o, r in results.items()}},
              open(os.path.join(a.out, "results.json"), "w"), indent=1)
    print(open(os.path.join(a.out, "table.md")).read())
    return 0


def table(results, target, a):
    """table.md: one row per optimizer at its best lr (steps and seconds to the target: seed means)."""
    ad = results["adamw"]["runs"]
    lines = [f"Target: AdamW's final validation loss at its best lr, {target:.4f} (mean of {len(ad)} seeds); "
             f"{a.steps} steps at dp {a.dp}.", "",
             "| optimizer | best lr | final val loss (mean, min–max) | steps to target | seconds to target | s/step "
             "| optimizer s/step | state vs adamw (MiB, rank 0) |",
             "|---|---|---|---|---|---|---|---|"]
    ad_held = ad[0][3]
    for o, r in results.items():
        finals = [x[0][-1][2] for x in r["runs"] if x[0]] or [math.inf]
        hits = [to_target(x[0], target) for x in r["runs"]]
        st = [h[0] for h in hits if h[0] is not None]
        sec = [h[1] for h in hits if h[1] is not None]
        per = sum(x[1] for x in r["runs"]) / len(r["runs"])
        opt = sum(x[2] for x in r["runs"]) / len(r["runs"])
        reach = f"{sum(st) / len(st):.0f} ({len(st)}/{len(hits)} seeds)" if st else "not reached"
        secs = f"{sum(sec) / len(sec):.1f}" if sec else "–"
        lines.append(f"| {o} | {r['best_lr']:g} | {sum(finals) / len(finals):.4f} ({min(finals):.4f}–{max(finals):.4f}) "
                     f"| {reach} | {secs} | {per:.3f} | {opt:.4f} | {(r['runs'][0][3] - ad_held) / 2**20:+.2f} |")
    open(os.path.join(a.out, "table.md"), "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
