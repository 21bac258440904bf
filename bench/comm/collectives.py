#!/usr/bin/env python3
"""The sparse collectives against dense MPI_Allreduce on 2, 4 and 8 ranks (docs/compression.md).

Runs build/bench/comm/bench_sparse_collectives under mpirun for each rank count and message
size (one invocation per size: fewer repetitions for the large ones), collects the rows, and
writes RESULTS/collectives.json, collectives.md (the crossover density of each method: where its
time meets the dense all-reduce's, interpolated in log density between the measured densities,
next to the planner's break-even) and collectives.svg (time / dense time against density).
On a 2-core machine 4 and 8 ranks are oversubscribed: every time is measured side by side with
dense in the same run, and the ratios are what to read; the bytes are exact.

  bench/comm/collectives.py [--build build] [--out bench/comm/results] [--ranks 2,4,8] [--sizes ...]
  bench/comm/collectives.py --from-json      # only rewrite the table and chart from RESULTS/collectives.json
"""
import argparse
import json
import math
import os
import subprocess
import sys

DENSITIES = "0.001,0.003,0.01,0.03,0.1"
REPS = {1 << 20: 7, 1 << 22: 5, 1 << 24: 3, 1 << 26: 3}
COLORS = {"allgather": "#1f77b4", "allgather_packed": "#9467bd", "split_reduce": "#ff7f0e", "shared_index": "#2ca02c", "topk_e2e": "#d62728"}
DASH = {1 << 20: "2 2", 1 << 22: "6 3", 1 << 24: "", 1 << 26: "10 2 2 2"}


def crossover(points):
    """points: [(density, ratio)] ascending; the density where the ratio crosses 1 (log-log interpolation)."""
    if not points:
        return None, "no data"
    if points[0][1] >= 1:
        faster = [d for d, r in points if r < 1]
        if faster:  # slower at the lowest density but faster at some higher one: no single crossing
            return 0.0, "slower at " + f"{points[0][0]:g}" + ", faster only at " + ", ".join(f"{d:g}" for d in faster)
        return 0.0, f"never (slower at {points[0][0]:g})"
    for (d0, r0), (d1, r1) in zip(points, points[1:]):
        if r0 < 1 <= r1:
            t = (0 - math.log(r0)) / (math.log(r1) - math.log(r0))
            d = math.exp(math.log(d0) + t * (math.log(d1) - math.log(d0)))
            return d, f"{d:.3g}"
    return 1.0, f"> {points[-1][0]:g} (faster at every density measured)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/comm/results")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--sizes", default=",".join(str(s) for s in REPS))
    ap.add_argument("--densities", default=DENSITIES)
    ap.add_argument("--e2e-max", type=int, default=1 << 24)
    ap.add_argument("--from-json", action="store_true", help="render the last run's rows again, run nothing")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        with open(os.path.join(args.out, "collectives.json")) as f:
            return render(args, json.load(f))
    rows = measure(args)
    with open(os.path.join(args.out, "collectives.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return render(args, rows)


def measure(args):
    """Every rank count and size under mpirun; the rows of bench_sparse_collectives --json."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
    rows = []
    exe = os.path.join(args.build, "bench", "comm", "bench_sparse_collectives")
    for p in [int(x) for x in args.ranks.split(",")]:
        for n in [int(x) for x in args.sizes.split(",")]:
            tmp = os.path.join(args.out, f"collectives_np{p}_{n}.json")
            cmd = ["mpirun", "-np", str(p), exe, "--sizes", str(n), "--densities", args.densities,
                   "--reps", str(REPS.get(n, 3)), "--json", tmp, "--e2e-max", str(args.e2e_max), "--e2e"]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, env=env)
            rows += json.load(open(tmp))
            os.remove(tmp)
    return rows


def render(args, rows):
    """collectives.md (with the planner's dense time and break-even beside the measured) and .svg."""
    methods = ["allgather", "allgather_packed", "split_reduce", "shared_index", "topk_e2e"]
    lines = ["| ranks | floats | dense s (planner's) | method | time / dense at 0.1%, 1%, 10% | bytes fewer at 0.1%, 1%, 10% | "
             "measured crossover | planner's break-even |", "|---|---|---|---|---|---|---|---|"]
    charts = []
    for p in sorted({r["ranks"] for r in rows}):
        chart = {"title": f"{p} ranks: time / dense MPI_Allreduce time", "x_label": "density", "y_label": "x dense",
                 "log_x": True, "log_y": True, "series": []}
        crossings = {}  # method -> the densities where it meets dense, one per size
        for n in sorted({r["floats"] for r in rows if r["ranks"] == p}):
            sel = [r for r in rows if r["ranks"] == p and r["floats"] == n]
            dense = next(r for r in sel if r["method"] == "dense")
            for m in methods:
                pts = sorted((r["density"], r["seconds"] / r["dense_seconds"]) for r in sel if r["method"] == m)
                if not pts:
                    continue
                by = {r["density"]: r for r in sel if r["method"] == m}
                where, text = crossover(pts)
                if 0 < where < 1:  # measured inside the densities run: marked on the dense line
                    crossings.setdefault(m, []).append(where)
                pred = [r["predicted_break_even"] for r in sel if r["method"] == m and r["predicted_break_even"] is not None
                        and not (isinstance(r["predicted_break_even"], float) and math.isnan(r["predicted_break_even"]))]
                pred_text = f"{pred[0]:.3g}" if pred else "–"
                ratio = ", ".join(f"{by[d]['seconds'] / by[d]['dense_seconds']:.2f}" if d in by else "–" for d in (0.001, 0.01, 0.1))
                fewer = ", ".join(f"{by[d]['dense_bytes'] / max(by[d]['bytes'], 1):.0f}x" if d in by else "–" for d in (0.001, 0.01, 0.1))
                lines.append(f"| {p} | {n:,} | {dense['seconds']:.4f} ({dense['predicted_seconds']:.4f}) | {m} | {ratio} | {fewer} | {text} | {pred_text} |")
                if m in COLORS:
                    chart["series"].append({"name": f"{m} {n >> 20}M", "color": COLORS[m], "dash": DASH.get(n, ""),
                                            "xs": [d for d, _ in pts], "ys": [q for _, q in pts], "markers": True})
        for m, xs in crossings.items():
            chart["series"].append({"name": f"{m} crossover", "color": COLORS[m], "xs": sorted(xs),
                                    "ys": [1.0] * len(xs), "markers": True, "dash": "1 4"})
        densities = sorted({r["density"] for r in rows if r["ranks"] == p and r["method"] != "dense"})
        chart["series"].append({"name": "dense = 1", "color": "#000", "xs": [densities[0], densities[-1]], "ys": [1, 1]})
        charts.append(chart)
    with open(os.path.join(args.out, "collectives.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    spec = os.path.join(args.out, "collectives_chart.json")
    with open(spec, "w") as f:
        json.dump({"height": 380, "width": 900, "charts": charts}, f)
    subprocess.run([os.path.join(args.build, "bench", "comm", "comm_chart"), spec,
                    os.path.join(args.out, "collectives.svg")], check=True)


if __name__ == "__main__":
    sys.exit(main())
