#!/usr/bin/env python3
"""Three measured steps of a cluster -> the rest of that cluster's runs.

For each cluster of the published runs (one source on one device, >= 6 usable rows) and each of
--draws random triples of its rows (seeded): `exatrain calibrate` the triple (device constants;
automatic choice), then predict the cluster's OTHER rows with that calibration and report the
MAPE on them. The study starts from the constants fitted WITHOUT the cluster's source (its
leave-one-source-out fold, from `exatrain validate --json`), so nothing of the cluster was seen
before its three steps. Printed: per cluster the MAPE on the rest before calibrating (the fold's
constants) and after (median, quartiles over the draws).

With --whole: calibrate each cluster on ALL its rows instead and print the leave-one-out MAPE
that `exatrain calibrate` reports (each row predicted by the constants fitted on the others), with
the constants it chose: what a user with many runs of one machine gets.

With --spread: each triple takes one row from each third of the cluster ordered by attention's
share of the predicted step (short, middling and long sequences for their model): three runs
chosen as a user would choose them to calibrate attention apart from the rest.

With --prior-from-other-clusters: each cluster's calibrations take their prior's widths and noise
from the clusters of OTHER sources only (calibrate --prior), measured as calibrate's defaults were
(plan/calibrate.hpp CalibrationPrior): every cluster calibrated on all its rows without a prior,
the root mean square over the others of ln(fitted / fold) for sustained (the other constants'
widths are 1.0, as calibrate's), and the median of their fitted MAPEs. So none of the scored cluster's
rows, nor its source's other clusters, are in its prior (the other sources' folds, which set their
starting constants, did see them, as every fold sees every source but its own).

With --prior off: calibrate without the prior (calibrate --prior off).

With --never-fitted: the clusters of bench/validation/never_fitted_runs.csv (sources no constant was
fitted to) with >= 5 usable rows, each calibrated on EVERY triple of its rows (not --draws random ones)
starting from the shipped constants (no fold: nothing of these sources was ever fitted).

usage: /usr/bin/python3 bench/validation/calibration_study.py build/exatrain [CSV] [--draws 20] [--fit LIST] [--whole] [--spread]
                                                              [--prior-from-other-clusters | --prior off] [--never-fitted]
"""
import csv, itertools, json, math, os, random, re, statistics, subprocess, sys, tempfile

exe = sys.argv[1]
root = os.path.dirname(os.path.abspath(__file__))
draws = int(sys.argv[sys.argv.index("--draws") + 1]) if "--draws" in sys.argv else 20
FIT = ["--fit", sys.argv[sys.argv.index("--fit") + 1]] if "--fit" in sys.argv else []
PRIOR = ["--prior", sys.argv[sys.argv.index("--prior") + 1]] if "--prior" in sys.argv else []
if PRIOR and "--prior-from-other-clusters" in sys.argv:
    sys.exit("--prior and --prior-from-other-clusters exclude each other")
args = [a for i, a in enumerate(sys.argv[2:], 2)
        if not a.startswith("--") and sys.argv[i - 1] not in ("--draws", "--fit", "--prior")]
never_fitted = "--never-fitted" in sys.argv
src_csv = args[0] if args else os.path.join(root, "never_fitted_runs.csv" if never_fitted else "published_runs.csv")
MIN_ROWS = 5 if never_fitted else 6

rows = list(csv.reader(open(src_csv)))
header, body = rows[0], rows[1:]
rep = json.loads(subprocess.run([exe, "validate", src_csv, "--json", "--never-fitted", "none"] +
                                (["--in-sample"] if never_fitted else []), capture_output=True, text=True, check=True).stdout)
# Each source's leave-one-source-out constants; none for never-fitted sources (the shipped ones).
fold = {s["source"]: "" if never_fitted else s["held_out_constants"] for s in rep["sources"]}
clusters = {}
att_share = {}  # attention's share of the predicted step, per row
for r in rep["rows"]:
    clusters.setdefault((r["source"], r["device"]), []).append(r["row"])
    att_share[r["row"]] = r["compute_s"]["attention"] / r["step_time_s"]
spread = "--spread" in sys.argv

tmp = tempfile.mkdtemp()
def write(name, idx):
    path = os.path.join(tmp, name)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header] + [body[i - 1] for i in idx])
    return path

def cal_args(source):
    # "a100.sustained=0.85 hopper.sustained=0.67 fp8_relative=0.98 ... (others ...)" -> --cal k=v
    return [f"--cal={m}" for m in re.findall(r"(\S+=[0-9.eE+-]+)", fold[source])]

def mape_on(path, extra):
    out = subprocess.run([exe, "validate", path, "--in-sample", "--json"] + extra, capture_output=True, text=True, check=True).stdout
    errs = [abs(r["error"]) for r in json.loads(out)["rows"]]
    return 100 * sum(errs) / len(errs)

def fitted_whole(source, idx, extra):
    """calibrate on all of a cluster's rows: (stdout, {constant: ln(fitted / start)})."""
    out = subprocess.run([exe, "calibrate", write("all.csv", idx), "--out", os.path.join(tmp, "cal.toml")] +
                         cal_args(source) + extra, capture_output=True, text=True)
    moved = {m.group(1): math.log(float(m.group(2)) / float(m.group(3)))
             for m in re.finditer(r"^\S+\.(\w+) = ([0-9.e+-]+) \(shipped ([0-9.e+-]+)\)", out.stdout, re.M)}
    return out, moved

def loco_priors():
    """Per cluster, --prior from the other clusters' own constants (see the docstring)."""
    whole = {}
    for key, idx in clusters.items():
        if len(idx) >= MIN_ROWS:
            out, moved = fitted_whole(key[0], idx, ["--prior", "off"])
            if out.returncode != 0:
                sys.exit(f"calibrate refused {key}: {out.stderr.strip()}")
            fit = float(re.search(r"fitted ([0-9.]+)%", out.stdout).group(1)) / 100
            whole[key] = (moved, fit)
    priors = {}
    for key in whole:
        others = [whole[k] for k in whole if k[0] != key[0]]  # other sources only
        seen = [m["sustained"] for m, _ in others]  # the others' widths are 1.0, as calibrate's
        items = [f"sustained={math.sqrt(sum(x * x for x in seen) / len(seen)):.3f}"]
        items.append(f"noise={statistics.median(f for _, f in others):.3f}")
        priors[key] = ["--prior", ",".join(items)]
    return priors

LOCO = loco_priors() if "--prior-from-other-clusters" in sys.argv else None
def prior_args(key):
    return LOCO[key] if LOCO is not None else PRIOR

if "--whole" in sys.argv:
    print(f"{'cluster':<46} {'rows':>4} {'fold%':>9} {'fitted%':>8} {'left out%':>9}  constants fitted")
    for (source, device), idx in sorted(clusters.items()):
        if len(idx) < MIN_ROWS:
            continue
        cal = os.path.join(tmp, "cal.toml")
        out = subprocess.run([exe, "calibrate", write("all.csv", idx), "--out", cal] + cal_args(source) + FIT +
                             prior_args((source, device)), capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{source[:30] + ' ' + device:<46} {len(idx):>4}  refused: {out.stderr.strip()[:120]}")
            continue
        m = re.search(r"shipped ([0-9.]+)%, fitted ([0-9.]+)%, leave-one-out ([0-9.]+)%", out.stdout)
        names = "+".join(sorted(k.group(1) for k in re.finditer(r"^(\w+) = ", open(cal).read().split("[device.")[1], re.M)))
        print(f"{source[:30] + ' ' + device:<46} {len(idx):>4} {m.group(1):>9} {m.group(2):>8} {m.group(3):>9}  {names}", flush=True)
    sys.exit(0)

print(f"{'cluster':<46} {'rows':>4} {'before%':>8} {'after: median%':>15} {'q1..q3%':>14}  constants fitted (share of draws)")
for (source, device), idx in sorted(clusters.items()):
    if len(idx) < MIN_ROWS:
        continue
    rng = random.Random(f"{source} {device}")
    base = cal_args(source)
    before, after, chosen = [], [], {}
    triples = [list(t) for t in itertools.combinations(sorted(idx), 3)] if never_fitted else [None] * draws
    for given in triples:
        if given:
            three = given
        elif spread:  # one run from each third of the cluster by attention's share of the step
            by = sorted(idx, key=lambda i: att_share[i])
            k = len(by) // 3
            three = sorted(rng.choice(part) for part in (by[:k], by[k:len(by) - k], by[len(by) - k:]))
        else:
            three = sorted(rng.sample(idx, 3))
        rest = [i for i in idx if i not in three]
        rest_csv = write("rest.csv", rest)
        before.append(mape_on(rest_csv, base))
        cal = os.path.join(tmp, "cal.toml")
        out = subprocess.run([exe, "calibrate", write("three.csv", three), "--out", cal] + base + FIT +
                             prior_args((source, device)), capture_output=True, text=True)
        if out.returncode != 0:
            after.append(float("nan"))
            chosen["refused"] = chosen.get("refused", 0) + 1
            continue
        names = tuple(sorted(m.group(1) for m in re.finditer(r"^(\w+) = ", open(cal).read().split("[device.")[1], re.M)))
        chosen[names] = chosen.get(names, 0) + 1
        after.append(mape_on(rest_csv, base + ["--calibration", cal]))
    ok = [a for a in after if a == a]
    if not ok:
        print(f"{source[:30] + ' ' + device:<46} {len(idx):>4} {statistics.median(before):>8.1f} {'refused':>15}", flush=True)
        continue
    q = statistics.quantiles(ok, n=4) if len(ok) >= 2 else [ok[0]] * 3
    share = ", ".join(f"{'+'.join(k) if isinstance(k, tuple) else k} {v}/{len(triples)}" for k, v in chosen.items())
    print(f"{source[:30] + ' ' + device:<46} {len(idx):>4} {statistics.median(before):>8.1f} {statistics.median(ok):>15.1f} "
          f"{q[0]:>6.1f}..{q[2]:<6.1f}  {share}", flush=True)
