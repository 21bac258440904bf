#!/usr/bin/env python3
"""Convergence under gradient compression (docs/compression.md, "Convergence").

A small GPT on the bundled corpus at dp 4 (4 MPI ranks, --ranks for others; on a 2-core machine they are
oversubscribed: times are side by side in one run, as ratios to the dense run), the same steps
for the dense reduction and for each compressor of [comm]; the Adam question (top-k under AdamW
with and without error feedback, and with a dense warm-up) and DGC against its own dense SGD
baseline. Per run: final validation loss and its cost against the run's baseline, the
data-parallel gradient bytes per step (rank 0's ledger, metrics.jsonl bytes_sent: every dp kind
but ZeRO's weight all-gather) and the reduction against dense, the median time per step, the
compressor's figures (density, index overlap). Writes RESULTS/convergence.json, .md and .svg
(validation loss against steps and against bytes sent, drawn by build/bench/comm/comm_chart).

  bench/comm/convergence.py [--build build] [--out bench/comm/results] [--steps 200] [--ranks 4] [--only a,b]

--only runs the named runs and their baselines, and keeps the other runs of the existing
convergence.json whose job is unchanged.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

MODEL = """[model]
layers = 4
hidden = 128
heads = 4
seq_len = 64
vocab = 4096
"""
def parallel(ranks):
    # The same global batch (16 sequences) on any number of ranks, 16 / ranks sequences per rank
    # (--ranks 8: the data-parallel bytes at twice the ranks). Each rank draws its own sequences, so
    # the data order, and the dense baseline's loss, differ with the rank count.
    return f"""[parallel]
gpus = {ranks}
tp = 1
pp = 1
dp = {ranks}
zero = 0
recompute = "none"
global_batch = 16
micro_batch = {16 // ranks}
"""


def train(steps, lines, lr):
    return f"""[train]
steps = {steps}
lr = {lr}
min_lr = {lr / 10}
warmup_steps = 20
eval_every = {max(1, steps // 6)}
eval_batches = 16
threads = 1
log_every = {steps}
{lines}"""


ADAM = ("", 1e-3)
ADAM_SEED2 = ("seed = 2\n", 1e-3)  # a second seed for the closest runs
# Seeds 3 and 4 were never run before the setting below was fixed (stop 30's shipped one: top-k 1.8%
# of the momentum, packed, small pieces as signs, 50 dense warm-up steps): they judge it out of sample.
ADAM_SEED3 = ("seed = 3\n", 1e-3)
ADAM_SEED4 = ("seed = 4\n", 1e-3)
SGD = ('optimizer = "sgd"\n[optimizer]\nmomentum = 0.9\n', 0.3)
SGD_PLAIN = ('optimizer = "sgd"\n[optimizer]\nmomentum = 0\n', 0.3)

# (name, baseline, optimizer, [comm] lines)
RUNS = [
    ("dense adamw", None, ADAM, ""),
    ("topk 1%", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\n'),
    ("topk 0.1%", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\n'),
    ("topk 0.1% split", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\ncollective = "split_reduce"\n'),
    ("topk 1% sampled", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nselection = "sample"\n'),
    ("blocktopk 1%", "dense adamw", ADAM, 'compressor = "blocktopk"\ndensity = 0.01\nblock_size = 64\n'),
    ("blocktopk 0.1%", "dense adamw", ADAM, 'compressor = "blocktopk"\ndensity = 0.001\nblock_size = 64\n'),
    ("temporal 1%", "dense adamw", ADAM, 'compressor = "temporal"\ndensity = 0.01\nrefresh_every = 10\n'),
    ("temporal 0.1%", "dense adamw", ADAM, 'compressor = "temporal"\ndensity = 0.001\nrefresh_every = 10\n'),
    ("powersgd r4", "dense adamw", ADAM, 'compressor = "powersgd"\nrank = 4\n'),
    ("sign", "dense adamw", ADAM, 'compressor = "sign"\n'),
    # The Adam question: the raw gradient compressed without error feedback, and with a dense warm-up.
    ("topk 1% no EF", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nerror_feedback = false\n'),
    ("topk 0.1% no EF", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\nerror_feedback = false\n'),
    ("topk 0.1% warm-up", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\nwarmup_steps = 30\n'),
    ("topk 1% warm-up", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nwarmup_steps = 30\n'),
    # What ships for Adam: 1-bit Adam's frozen variance after a dense warm-up, with error feedback.
    ("topk 1% frozen v", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nwarmup_steps = 30\nadam_variance = "freeze"\n'),
    ("topk 0.1% frozen v", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\nwarmup_steps = 30\nadam_variance = "freeze"\n'),
    ("temporal 1% frozen v", "dense adamw", ADAM, 'compressor = "temporal"\ndensity = 0.01\nrefresh_every = 10\nwarmup_steps = 30\nadam_variance = "freeze"\n'),
    ("topk 0.1% split frozen v", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\ncollective = "split_reduce"\nwarmup_steps = 30\nadam_variance = "freeze"\n'),
    # Compressing Adam's momentum instead of the gradient (1-bit Adam's scheme, with top-k or temporal
    # reuse in place of signs): local momentum from the synchronised one, error feedback on it, v frozen.
    ("topk 1% momentum", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 0.1% momentum", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.001\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("temporal 0.1% momentum", "dense adamw", ADAM, 'compressor = "temporal"\ndensity = 0.001\nrefresh_every = 10\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # DGC's local velocity (u = b1 u + (1 - b1) g, v += u, top-k of v, masking) as AdamW's momentum.
    ("dgc 1% adam momentum", "dense adamw", ADAM, 'compressor = "dgc"\ndensity = 0.01\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("dgc 0.1% adam momentum", "dense adamw", ADAM, 'compressor = "dgc"\ndensity = 0.001\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # The same with the norms and biases compressed too (min_compress = 0, 5% of them per step)
    # instead of sent dense: their fixed bytes were half of what 100x fewer allows.
    ("dgc 0.1% adam momentum small 5%", "dense adamw", ADAM, 'compressor = "dgc"\ndensity = 0.001\nmin_compress = 0\nrole_density = { norm = 0.05, bias = 0.05 }\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("dgc 0.2% adam momentum small 5%", "dense adamw", ADAM, 'compressor = "dgc"\ndensity = 0.002\nmin_compress = 0\nrole_density = { norm = 0.05, bias = 0.05 }\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("temporal 0.5% momentum", "dense adamw", ADAM, 'compressor = "temporal"\ndensity = 0.005\nrefresh_every = 20\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("sign momentum", "dense adamw", ADAM, 'compressor = "sign"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # The momentum's top-k packed (parallel/pair_codec.hpp): signs with one magnitude per piece (STC)
    # and Rice-coded index gaps, about 9 bits a pair instead of 64.
    ("topk 1% momentum packed", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nvalues = "sign"\nindices = "golomb"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 0.7% momentum packed", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.007\nvalues = "sign"\nindices = "golomb"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1% momentum bf16 golomb", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nvalues = "bf16"\nindices = "golomb"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # ... and the norms and biases as scaled signs with error feedback instead of the fp32 all-reduce
    # (1-bit Adam sends every tensor so): their fixed bytes were half of what is left.
    ("topk 1% momentum packed small sign", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.01\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1.8% momentum packed small sign", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.018\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1.8% momentum packed small sign warm-up 50", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 0.018\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 50\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # The control: every element of the momentum sent (density 1), v frozen after 50 dense steps: dense
    # AdamW with 1-bit Adam's frozen variance (tests/dist/dist_compression_momentum.cpp), what
    # compression itself costs on top of the freeze.
    ("frozen v at 50 density 1", "dense adamw", ADAM, 'compressor = "topk"\ndensity = 1.0\nwarmup_steps = 50\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("dense adamw seed 2", None, ADAM_SEED2, ""),
    ("topk 1% momentum seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "topk"\ndensity = 0.01\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("dgc 0.1% adam momentum seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "dgc"\ndensity = 0.001\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1% momentum packed seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "topk"\ndensity = 0.01\nvalues = "sign"\nindices = "golomb"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1% momentum packed small sign seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "topk"\ndensity = 0.01\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1.8% momentum packed small sign seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "topk"\ndensity = 0.018\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("topk 1.8% momentum packed small sign warm-up 50 seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "topk"\ndensity = 0.018\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 50\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("frozen v at 50 density 1 seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "topk"\ndensity = 1.0\nwarmup_steps = 50\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("sign momentum seed 2", "dense adamw seed 2", ADAM_SEED2, 'compressor = "sign"\nwarmup_steps = 30\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # The shipped setting judged on seeds it was not chosen on.
    ("dense adamw seed 3", None, ADAM_SEED3, ""),
    ("topk 1.8% momentum packed small sign warm-up 50 seed 3", "dense adamw seed 3", ADAM_SEED3, 'compressor = "topk"\ndensity = 0.018\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 50\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    ("dense adamw seed 4", None, ADAM_SEED4, ""),
    ("topk 1.8% momentum packed small sign warm-up 50 seed 4", "dense adamw seed 4", ADAM_SEED4, 'compressor = "topk"\ndensity = 0.018\nvalues = "sign"\nindices = "golomb"\nsmall_pieces = "sign"\nwarmup_steps = 50\nadam_variance = "freeze"\ncompress = "momentum"\n'),
    # DGC needs plain SGD (its momentum correction is the momentum): its baseline is dense SGD.
    ("dense sgd", None, SGD, ""),
    ("topk 1% sgd", "dense sgd", SGD, 'compressor = "topk"\ndensity = 0.01\n'),
    ("dgc 1%", "dense sgd", SGD_PLAIN, 'compressor = "dgc"\ndensity = 0.01\nwarmup = "exponential"\nwarmup_steps = 30\n'),
    ("dgc 0.1%", "dense sgd", SGD_PLAIN, 'compressor = "dgc"\ndensity = 0.001\nwarmup = "exponential"\nwarmup_steps = 30\n'),
]
COLORS = ["#000000", "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896",
          "#9467bd", "#c5b0d5", "#8c564b", "#e377c2", "#f7b6d2", "#7f7f7f", "#bcbd22", "#17becf", "#9edae5", "#393b79",
          "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194",
          "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd", "#9c9ede"]


def dp_gradient_bytes(record):
    return sum(v for k, v in record.get("bytes_sent", {}).items() if k.startswith("dp_") and k != "dp_all_gather")


def job_text(args, opt, comm, run_dir):
    job = MODEL + parallel(args.ranks) + train(args.steps, f'run_dir = "{run_dir}"\n' + opt[0], opt[1])
    return job + "[comm]\n" + comm if comm else job


def same_job(a, b):
    strip = lambda t: [l for l in t.splitlines() if not l.startswith("run_dir = ")]
    return strip(a) == strip(b)


def run_one(args, name, opt, comm, run_dir):
    job = job_text(args, opt, comm, run_dir)
    path = run_dir + ".toml"
    metrics = os.path.join(run_dir, "metrics.jsonl")
    done = os.path.exists(path) and open(path).read() == job and os.path.exists(metrics) and any(
        json.loads(l).get("step") == args.steps and "val_loss" in l for l in open(metrics))
    wall = 0.0
    if not (done and args.reuse):  # --reuse: a finished run of the same job is read, not rerun
        with open(path, "w") as f:
            f.write(job)
        shutil.rmtree(run_dir, ignore_errors=True)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1",
                   OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
        t0 = time.time()
        subprocess.run(["mpirun", "-np", str(args.ranks), os.path.join(args.build, "exatrain"), "train", path], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        wall = time.time() - t0
    records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in records if "loss" in r]
    vals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    per_step = [dp_gradient_bytes(r) for r in steps]
    cumulative, total = [], 0
    for b in per_step:
        total += b
        cumulative.append(total)
    comp = [r.get("compression", {}) for r in steps]
    overlap = [c["index_overlap"] for c in comp if "index_overlap" in c]
    return {"name": name, "job": job, "wall_s": wall, "final_val_loss": vals[-1][1], "val": vals,
            "final_loss": steps[-1]["loss"],
            "bytes_per_step": statistics.median(per_step[-50:]), "bytes_cumulative": cumulative,
            "seconds_per_step": statistics.median(r["seconds"] for r in steps[5:]),
            "density": statistics.median(c.get("density", 1.0) for c in comp[-50:]) if comp[-1] else 1.0,
            "index_overlap": statistics.median(overlap[-50:]) if overlap else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None, help="default bench/comm/results, bench/comm/results/dpN for --ranks N != 4")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=4, choices=[2, 4, 8, 16], help="data-parallel ranks (global batch 16)")
    ap.add_argument("--only", default="", help="comma-separated run names (default: all)")
    ap.add_argument("--reuse", action="store_true", help="read a finished run of the same job instead of rerunning it")
    ap.add_argument("--chart-only", action="store_true", help="redraw the chart from OUT/convergence.json, run nothing")
    args = ap.parse_args()
    if args.out is None:  # other rank counts never overwrite the dp 4 results (no job of theirs matches)
        args.out = "bench/comm/results" if args.ranks == 4 else f"bench/comm/results/dp{args.ranks}"
    if args.chart_only:
        with open(os.path.join(args.out, "convergence.json")) as f:
            loaded = json.load(f)
        args.steps, args.ranks = loaded["steps"], loaded.get("ranks", args.ranks)
        return write_chart(args, loaded["runs"])
    os.makedirs(args.out, exist_ok=True)
    runs_dir = os.path.abspath(os.path.join(args.out, "runs"))
    os.makedirs(runs_dir, exist_ok=True)
    only = set(s.strip() for s in args.only.split(",") if s.strip())
    results = {}
    # --only: the other runs of the existing convergence.json are kept when their job is unchanged
    # (up to run_dir), so the table and the chart stay whole.
    previous = {}
    old_path = os.path.join(args.out, "convergence.json")
    if only and os.path.exists(old_path):
        with open(old_path) as f:
            previous = json.load(f).get("runs", {})
    for name, base, opt, comm in RUNS:
        if only and name not in only and name not in {b for n, b, _, _ in RUNS if n in only}:
            old = previous.get(name)
            if old and same_job(old["job"], job_text(args, opt, comm, "")):
                results[name] = old
            continue
        r = run_one(args, name, opt, comm, os.path.join(runs_dir, name.replace(" ", "_").replace("%", "pct")))
        r["baseline"] = base
        results[name] = r
        print(f"{name:18s} val {r['final_val_loss']:.4f}  bytes/step {r['bytes_per_step']:>10.0f}  "
              f"s/step {r['seconds_per_step']:.3f}  wall {r['wall_s']:.0f} s", flush=True)
    for r in results.values():
        b = results.get(r["baseline"]) if r["baseline"] else None
        r["val_cost_pct"] = 100 * (r["final_val_loss"] - b["final_val_loss"]) / b["final_val_loss"] if b else 0.0
        r["bytes_reduction"] = b["bytes_per_step"] / r["bytes_per_step"] if b and r["bytes_per_step"] else 1.0
        # Over the whole run, the dense warm-up steps included (they dominate a short run's bytes).
        r["bytes_reduction_run"] = (b["bytes_cumulative"][-1] / r["bytes_cumulative"][-1]
                                    if b and r["bytes_cumulative"][-1] else 1.0)
        r["time_ratio"] = r["seconds_per_step"] / b["seconds_per_step"] if b else 1.0
    with open(os.path.join(args.out, "convergence.json"), "w") as f:
        json.dump({"steps": args.steps, "ranks": args.ranks, "runs": results}, f, indent=1)
    lines = ["| run | final val loss | cost vs baseline | dp bytes/step | fewer bytes | fewer bytes, whole run | s/step (x baseline) | density | index overlap |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results.values():
        ov = f"{r['index_overlap']:.2f}" if r["index_overlap"] is not None else "–"
        lines.append(f"| {r['name']} | {r['final_val_loss']:.4f} | {r['val_cost_pct']:+.2f}% | {r['bytes_per_step']:,.0f} | "
                     f"{r['bytes_reduction']:.0f}x | {r['bytes_reduction_run']:.1f}x | "
                     f"{r['seconds_per_step']:.3f} ({r['time_ratio']:.2f}) | "
                     f"{r['density']:.4f} | {ov} |")
    with open(os.path.join(args.out, "convergence.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    write_chart(args, results)


# The runs the chart draws: the list (dense, each compressor at 1% and 0.1%, PowerSGD rank
# 4, 1-bit; DGC under SGD) and the shipped AdamW setting, seed 1. The table has every run; fifty
# lines in one chart could not be told apart. A study with few of these draws all of its runs.
CHART_RUNS = ["dense adamw", "topk 1%", "topk 0.1%", "blocktopk 1%", "blocktopk 0.1%", "temporal 1%", "temporal 0.1%",
              "powersgd r4", "sign", "topk 1.8% momentum packed small sign warm-up 50", "dense sgd", "dgc 1%", "dgc 0.1%"]


def write_chart(args, results):
    chart_spec = {"height": 360, "charts": [
        {"title": f"Validation loss, dp {args.ranks}, {args.steps} steps", "x_label": "step", "y_label": "validation loss",
         "series": []},
        {"title": "Validation loss against data-parallel bytes sent (rank 0, cumulative)", "x_label": "bytes sent",
         "y_label": "validation loss", "log_x": True, "series": []}]}
    drawn = [results[n] for n in CHART_RUNS if n in results]
    if len(drawn) < len(CHART_RUNS) // 2:  # a smaller study (--steps 600, --ranks 8): all of its runs
        drawn = list(results.values())
    for i, r in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        dash = "6 3" if r["baseline"] == "dense sgd" or r["name"] == "dense sgd" else ""
        xs = [s for s, _ in r["val"]]
        ys = [v for _, v in r["val"]]
        chart_spec["charts"][0]["series"].append({"name": r["name"], "color": color, "xs": xs, "ys": ys,
                                                  "markers": True, "dash": dash})
        bx = [r["bytes_cumulative"][s - 1] for s in xs]
        chart_spec["charts"][1]["series"].append({"name": r["name"], "color": color, "xs": bx, "ys": ys,
                                                  "markers": True, "dash": dash})
    spec_path = os.path.join(args.out, "convergence_chart.json")
    with open(spec_path, "w") as f:
        json.dump(chart_spec, f)
    subprocess.run([os.path.join(args.build, "bench", "comm", "comm_chart"), spec_path,
                    os.path.join(args.out, "convergence.svg")], check=True)


if __name__ == "__main__":
    sys.exit(main())
