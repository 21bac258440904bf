#!/usr/bin/python3
"""Prints the tables of docs/frontier.md from the JSONs and run.out that run.sh wrote.
Usage: /usr/bin/python3 docs/frontier/tables.py  (from the repository root, after run.sh)."""
import json, os, re

D = os.path.dirname(os.path.abspath(__file__))
MODELS = [("22B", "gpt3-22b", 440e9), ("175B", "gpt3-175b", 3.5e12), ("1T", "gpt3-1t", 20e12)]
NODES = [128, 384, 9408]
DAY = 86400.0


def plan_text(p):
    text = f"tp{p['tp']} pp{p['pp']} dp{p['dp']} cp{p['cp']} vp{p['vp']} z{p['zero']} mb{p['micro_batch']} {p['recompute']}"
    return text + (" sp" if p["seq_parallel"] else "")


def exposed(b, step):
    """'compute 84%; tp_comm 8.6%, pp_bubble 4.1%': compute and the two largest other parts."""
    others = sorted(((v, k) for k, v in b.items() if k != "compute"), reverse=True)[:2]
    return f"compute {100 * b['compute'] / step:.0f}%; " + ", ".join(f"{k} {100 * v / step:.1f}%" for v, k in others)


print("| model | nodes | global batch | best plan | step s | MFU % | GiB/GCD | M tokens/s | days 300B tok"
      " | days 20 tok/param | what the step is made of (exposed) | searched / fit |")
print("|---" * 12 + "|")
best = {}
for name, stem, chinchilla in MODELS:
    for nodes in NODES:
        d = json.load(open(f"{D}/{stem}-{nodes}.json"))
        b = d["best"]
        best[(name, nodes)] = b
        step, tps = b["step_time_s"], b["tokens_per_s"]
        print(f"| {name} | {nodes} | {b['plan']['global_batch']} | {plan_text(b['plan'])} | {step:.2f} | {100 * b['mfu']:.1f}"
              f" | {b['memory_gib_per_gpu']['total']:.1f} | {tps / 1e6:.3f} | {300e9 / tps / DAY:.1f} | {chinchilla / tps / DAY:.1f}"
              f" | {exposed(b['breakdown_s'], step)} | {d['searched']:,} / {d['feasible']:,} |")

print("\nextra figures per case: HFU, checkpoint write s, Young/Daly interval s (steps), runner-up layout")
for (name, nodes), b in best.items():
    interval = b["checkpoint_interval_s"]
    print(f"{name} {nodes}: HFU {100 * b['hfu']:.1f}%  bubble {100 * b['bubble_fraction']:.1f}%  checkpoint {b['checkpoint_write_s']:.2f} s,"
          f" every {interval:.0f} s ({interval / b['step_time_s']:.1f} steps)  most loaded pp rank {b['memory_most_loaded_pp_rank']}")

# The zero-fixed searches: "== no ZeRO-3: MODEL on N nodes, zero = Z" then the count line and plan #1.
rows = {}
lines = open(f"{D}/run.out").read().splitlines()
for i, line in enumerate(lines):
    m = re.match(r"== no ZeRO-3: (\S+) on (\d+) nodes, zero = (\d)", line)
    if m:
        f = lines[i + 2].split()
        kv = dict(x.split("=") for x in f[1:-4])
        text = f"tp{kv['tp']} pp{kv['pp']} dp{kv['dp']}" + (f" cp{kv['cp']}" if kv["cp"] != "1" else "") \
            + (f" vp{kv['vp']}" if kv["vp"] != "1" else "") + f" mb{kv['mb']}" \
            + (f" {kv['recompute']}" if kv["recompute"] != "none" else "") + (" no-sp" if kv["sp"] != "yes" else "")
        rows[(m[1], int(m[2]), int(m[3]))] = (text, float(f[-3]), float(f[-2]))

print("\n| model | nodes | best with zero = 0 | step s | MFU % | best with zero = 1 | step s | MFU % | best with zero = 2 | step s | MFU % | the table's winner |")
print("|---" * 12 + "|")
for name, stem, _ in MODELS:
    for nodes in NODES:
        cells = []
        for z in (0, 1, 2):
            text, step, mfu = rows[(stem, nodes, z)]
            cells.append(f"{text} | {step:g} | {mfu:.1f}")
        b = best[(name, nodes)]
        win = f"ZeRO-{b['plan']['zero']}, {b['step_time_s']:.2f} s"
        if b["plan"]["zero"] == 3:
            alt = min(rows[(stem, nodes, z)][1] for z in (0, 1, 2))
            win += f": best non-ZeRO-3 is +{100 * (alt / b['step_time_s'] - 1):.1f}%"
        print(f"| {name} | {nodes} | " + " | ".join(cells) + f" | {win} |")

# run.out's text plan #1 and the JSON's best come from two runs of the same search: they must agree
# (plans that tie exactly are ordered by an unstable sort, so both runs use --top 3).
for name, stem, _ in MODELS:
    for nodes in NODES:
        i = next(k for k, l in enumerate(lines) if l.startswith(f"== {stem} on {nodes} nodes"))
        f = lines[i + 4].split()
        kv = dict(x.split("=") for x in f[1:-4])
        p = best[(name, nodes)]["plan"]
        same = all(str(p[k]) == kv[j] for k, j in [("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"),
                                                   ("vp", "vp"), ("zero", "zero"), ("micro_batch", "mb")])
        assert same, f"{stem} {nodes}: JSON best {plan_text(p)} but run.out shows {lines[i + 4]}"
print("\nrun.out's plan #1 = the JSON's best in all 9 cases")
