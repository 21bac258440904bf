#!/usr/bin/python3
"""The optimizer study of issue 10 (docs/optimizers.md, "Benchmark"): a learning-rate sweep per
optimizer at one seed, then more seeds at each optimizer's best lr, on bench/optim/study.toml
under `mpirun -np DP`; the target is AdamW's final validation loss at its best lr (mean over its
seeds). A best lr at an end of its grid extends the grid (at most twice). Reports, per optimizer at
its best lr: final validation loss (mean and range over seeds), steps to the target (the first
evaluation at which the seeds' mean curve is at or below it) and their ratio to AdamW's, seconds
to it, seconds per step and the optimizer's share, and its memory against AdamW's; writes
results.json, table.md and one SVG chart (the seeds' mean validation loss against steps and
against seconds, every optimizer).

Losses do not depend on the machine's load (every run is deterministic); seconds do. So the
seconds come from a separate timing phase: every optimizer at its best lr for a few steps, in
interleaved rounds (A B C ... A B C ...), medians, beside the host's sgemm rate and load average;
seconds to the target = steps to it x that median s/step.

Usage: bench/optim/run_study.py [--build build] [--out bench/optim/results] [--quick]
  --quick: AdamW, SOAP and K-FAC, 2 lrs, 1 extra seed, 30 steps: checks the pipeline in minutes.
The full study (9 optimizers x 4 lrs + 2 seeds x 9, 400 steps at dp 2, then the timing) is sized
for about two hours on 2 quiet cores (it took about four with other work beside it).
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
    "kfac": [0.1, 0.3, 1.0, 3.0],  # SGD's scale: K-FAC's update feeds SGD with momentum
}
# The matrix optimizers on the layers' matrices with AdamW elsewhere (optim/mixed.hpp), their
# preconditioners refreshed every 10 steps from step 10.
EXTRA = {
    "shampoo": ["optimizer.others=adamw", "optimizer.precondition_frequency=10", "optimizer.start_preconditioning_step=10"],
    "soap": ["optimizer.others=adamw", "optimizer.precondition_frequency=10"],
    # K-FAC re-tuned on this benchmark (100-step trials at lr 1: damping 1e-2 over kfac-pytorch's 1e-3,
    # factors every step and eigendecompositions every 10 for a 400-step run; docs/optimizers.md).
    "kfac": ["optimizer.factor_update_steps=1", "optimizer.inv_update_steps=10", "optimizer.damping=0.01"],
}
SEEDS = [1, 2, 3]


def train_cmd(args, optimizer, lr, seed, steps, run_dir, build=None):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.dp),
           os.path.join(build or args.build, "exatrain"), "train", args.job, "--plain",
           "--set", f"train.optimizer={optimizer}", "--set", f"train.lr={lr}", "--set", f"train.seed={seed}",
           "--set", f"train.steps={steps}", "--set", f"train.run_dir={run_dir}"]
    for s in EXTRA.get(optimizer, []):
        cmd += ["--set", s]
    return cmd


def run(args, optimizer, lr, seed):
    """One training run; returns its metrics records (cached: a finished run is not repeated)."""
    name = f"{optimizer}-lr{lr:g}-s{seed}"
    run_dir = os.path.abspath(os.path.join(args.out, "runs", name))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(os.path.join(run_dir, "DONE")):
        subprocess.run(["rm", "-rf", run_dir], check=True)
        t0 = time.time()
        r = subprocess.run(train_cmd(args, optimizer, lr, seed, args.steps, run_dir), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:  # a diverged run (non-finite loss) counts as a failed lr, not a failed study
            print(f"  {name}: exit {r.returncode}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")
        print(f"  {name}: {time.time() - t0:.0f} s")
        os.makedirs(run_dir, exist_ok=True)
        open(os.path.join(run_dir, "DONE"), "w").write(str(r.returncode))
    if not os.path.exists(metrics):
        return []
    return [json.loads(l) for l in open(metrics)]


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if xs else math.nan


def timing(args, best, rounds, steps):
    """Seconds per step (and the optimizer's part of it, the slowest rank's) of each optimizer at its
    best lr, measured side by side: `rounds` rounds, each running every optimizer once for `steps`
    steps in turn, so that whatever else loads the machine falls on all of them alike. Per
    optimizer: the median over its rounds of each round's mean step after 5 warm-up steps (a mean:
    the preconditioner refreshes every few steps are part of the cost). Also rank 0's accounted
    bytes and peak RSS at the end of the first round (the memory column)."""
    per = {o: ([], [], []) for o in best}
    for k in range(rounds):
        for o, lr in best.items():
            run_dir = os.path.abspath(os.path.join(args.out, "timing", f"{o}-r{k}"))
            subprocess.run(["rm", "-rf", run_dir], check=True)
            subprocess.run(train_cmd(args, o, lr, SEEDS[0], steps, run_dir, args.timing_build),
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=True)
            recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
            recs = [r for r in recs if "loss" in r and r["step"] > 5]
            per[o][0].append(sum(r["seconds"] for r in recs) / len(recs))
            per[o][1].append(sum(max(b["optimizer"] for b in r["breakdown_s_per_rank"]) for r in recs) / len(recs))
            per[o][2].append((recs[-1]["accounted_bytes"], recs[-1]["peak_rss_bytes"]))
    return {o: (median(a), median(b), c[0]) for o, (a, b, c) in per.items()}


def sgemm_gflops(threads):
    """The host's float32 GEMM rate (numpy on Debian's OpenBLAS, 2048^3, best of 3) on `threads` threads."""
    code = ("import numpy as np, time\n"
            "a = np.random.rand(2048, 2048).astype(np.float32); b = a.copy(); a @ b\n"
            "best = min((lambda t0: (a @ b, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(3))\n"
            "print(2 * 2048 ** 3 / best / 1e9)\n")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(["/usr/bin/python3", "-c", code], env=env, stdout=subprocess.PIPE, text=True, check=True)
    return float(out.stdout.strip())


def summary(records):
    """Validation curve [(step, seconds so far, val_loss)], seconds per step, optimizer seconds per
    step (the slowest rank's), rank 0's accounted bytes (weights, gradients, optimizer state and
    scratch, activations: only the optimizer's part differs between optimizers) and its peak RSS."""
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
    rss = max((r.get("peak_rss_bytes", 0) for r in steps.values()), default=0)
    return curve, per_step, opt, held, rss


def to_target(curve, target):
    for step, seconds, loss in curve:
        if loss <= target:
            return step, seconds
    return None, None


def svg_chart(series, target, path):
    """Two panels: the seeds' mean validation loss against steps and against seconds (steps times
    the timing phase's seconds per step); one polyline per optimizer, the target dashed."""
    W, H, pad = 460, 300, 50
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
              "#17becf"]
    losses = [l for c in series.values() for _, _, l in c]
    lo, hi = min(losses + [target]), max(losses)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 40}" font-family="sans-serif" font-size="11">']
    for panel, (key, label) in enumerate([(0, "optimizer steps"), (1, "seconds (steps x timed s/step)")]):
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
            out.append(f'<polyline fill="none" stroke="{colors[i % len(colors)]}" stroke-width="1.5" points="{pts}"/>')
            if panel == 0:
                out.append(f'<text x="{x0 + W - pad - 90}" y="{pad + 14 * i}" fill="{colors[i % len(colors)]}">{name}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def sweep(a, o, grid, seed, extend):
    """Final validation loss per lr at one seed; while the best lr is at an end of the grid, one more
    lr beyond it (the grid's outer ratio), at most twice, so that the best is bracketed."""
    grid = sorted(grid)
    print(f"{o}: lr sweep {grid}")
    finals = {}
    for attempt in range(3):
        for lr in grid:
            if lr not in finals:
                curve = summary(run(a, o, lr, seed))[0]
                finals[lr] = curve[-1][2] if curve and curve[-1][0] == a.steps else math.inf
        best = min(finals, key=finals.get)
        lrs = sorted(finals)
        if not extend or lrs[0] < best < lrs[-1]:
            break
        if attempt == 2:
            print(f"  {o}: best lr {best:g} is still at the end of the grid (not bracketed)")
            break
        nxt = float(f"{best * (lrs[-1] / lrs[-2]):.3g}") if best == lrs[-1] else float(f"{best / (lrs[1] / lrs[0]):.3g}")
        print(f"  {o}: best lr {best:g} is at the end of the grid: adding {nxt:g}")
        grid = sorted(lrs + [nxt])
    return dict(sorted(finals.items()))


def mean_curve(runs):
    """The seeds' validation curves averaged at every evaluation step they all have: [(step, loss)]."""
    curves = [r[0] for r in runs if r[0]]
    if not curves:
        return []
    steps = sorted(set.intersection(*[{p[0] for p in c} for c in curves]))
    at = [{st: l for st, _, l in c} for c in curves]
    return [(st, sum(c[st] for c in at) / len(at)) for st in steps]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/optim/results")
    ap.add_argument("--job", default="bench/optim/study.toml")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--timing-rounds", type=int, default=3)
    ap.add_argument("--timing-steps", type=int, default=40)
    ap.add_argument("--timing-build", default=None, help="the build the timing phase runs (default: --build)")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    grids, seeds = GRIDS, SEEDS
    if a.quick:
        grids = {o: GRIDS[o][1:3] for o in ("adamw", "soap", "kfac")}
        seeds, a.steps, a.timing_rounds, a.timing_steps = SEEDS[:2], 30, 1, 10
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for o, grid in grids.items():
        finals = sweep(a, o, grid, seeds[0], extend=not a.quick)
        best = min(finals, key=finals.get)
        runs = [summary(run(a, o, best, s)) for s in seeds]
        results[o] = {"sweep": finals, "best_lr": best, "runs": runs}
    print(f"timing: {a.timing_rounds} interleaved rounds of {a.timing_steps} steps per optimizer at its best lr")
    host = {"sgemm_gflops_1_thread": sgemm_gflops(1), "sgemm_gflops_2_threads": sgemm_gflops(2),
            "loadavg_before_timing": os.getloadavg()[0]}
    timed = timing(a, {o: r["best_lr"] for o, r in results.items()}, a.timing_rounds, a.timing_steps)
    host["loadavg_after_timing"] = os.getloadavg()[0]
    for o, r in results.items():
        r["timed_s_per_step"], r["timed_optimizer_s_per_step"], r["timed_memory"] = timed[o]
        r["mean_curve"] = mean_curve(r["runs"])
    adamw = [r[0][-1][2] for r in results["adamw"]["runs"] if r[0]]
    target = sum(adamw) / len(adamw)
    table(results, target, a, host)
    svg_chart({o: [(st, st * r["timed_s_per_step"], l) for st, l in r["mean_curve"]] for o, r in results.items()
               if r["mean_curve"]}, target, os.path.join(a.out, "optimizers.svg"))
    json.dump({"target": target, "steps": a.steps, "dp": a.dp, "host": host,
               "results": {o: {"sweep": {str(k): v for k, v in r["sweep"].items()}, "best_lr": r["best_lr"],
                               "timed_s_per_step": r["timed_s_per_step"],
                               "timed_optimizer_s_per_step": r["timed_optimizer_s_per_step"],
                               "timed_memory": r["timed_memory"],
                               "mean_curve": r["mean_curve"], "runs": r["runs"]} for o, r in results.items()}},
              open(os.path.join(a.out, "results.json"), "w"), indent=1)
    print(open(os.path.join(a.out, "table.md")).read())
    return 0


def table(results, target, a, host):
    """table.md: one row per optimizer at its best lr. Steps to the target: the first evaluation at
    which the seeds' mean validation curve is at or below it (so every optimizer is judged on all
    its seeds; how many seeds reach it alone is beside it); seconds to it: those steps times the
    side-by-side timed seconds per step."""
    ad = results["adamw"]
    ad_steps = to_target([(st, 0, l) for st, l in ad["mean_curve"]], target)[0]
    lines = [f"Target: AdamW's final validation loss at its best lr, {target:.4f} (mean of {len(ad['runs'])} seeds); "
             f"{a.steps} steps at dp {a.dp} (evaluations every 25 steps). Times: {a.timing_rounds} interleaved "
             f"rounds of {a.timing_steps} steps per optimizer; host sgemm {host['sgemm_gflops_1_thread']:.0f} "
             f"GFLOP/s on 1 thread, {host['sgemm_gflops_2_threads']:.0f} on 2 (load average "
             f"{host['loadavg_before_timing']:.1f} before the timing, {host['loadavg_after_timing']:.1f} after).", "",
             "| optimizer | best lr | final val loss (mean, min–max) | steps to target (seeds alone) | steps vs adamw "
             "| seconds to target | time vs adamw | s/step | optimizer s/step | optimizer memory vs adamw (MiB: accounted, peak RSS; rank 0) | lr sweep (final val loss, seed 1) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o, r in results.items():
        finals = [x[0][-1][2] for x in r["runs"] if x[0]] or [math.inf]
        alone = sum(1 for x in r["runs"] if to_target(x[0], target)[0] is not None)
        st = to_target([(s_, 0, l) for s_, l in r["mean_curve"]], target)[0]
        per = r["timed_s_per_step"]
        if st is not None and ad_steps:
            steps, ratio, secs = f"{st} ({alone}/{len(r['runs'])})", f"{st / ad_steps:.2f}", f"{st * per:.1f}"
            tratio = f"{st * per / (ad_steps * ad['timed_s_per_step']):.2f}"
        else:
            steps, ratio, secs, tratio = f"not reached ({alone}/{len(r['runs'])})", "–", "–", "–"
        mem = (f"{(r['timed_memory'][0] - ad['timed_memory'][0]) / 2**20:+.2f}, "
               f"{(r['timed_memory'][1] - ad['timed_memory'][1]) / 2**20:+.1f}")
        sweep = ", ".join(f"{lr:g}: {v:.3f}" for lr, v in r["sweep"].items())
        lines.append(f"| {o} | {r['best_lr']:g} | {sum(finals) / len(finals):.4f} ({min(finals):.4f}–{max(finals):.4f}) "
                     f"| {steps} | {ratio} | {secs} | {tratio} | {per:.3f} | {r['timed_optimizer_s_per_step']:.4f} "
                     f"| {mem} | {sweep} |")
    open(os.path.join(a.out, "table.md"), "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
