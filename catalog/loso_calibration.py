#!/usr/bin/env python3
# usage: /usr/bin/python3 catalog/loso_calibration.py build/exatrain bench/validation/published_runs.csv
# Leave-one-source-out: refit the constants without one source, then predict that source.
import csv, os, re, subprocess, sys, ast, tempfile, shutil
exe = sys.argv[1]; full = sys.argv[2]; root = os.path.dirname(os.path.abspath(__file__))
rows = list(csv.reader(open(full))); h = rows[0]
def key(r): return r[0].split(' ')[0]
sources = sorted(set(key(r) for r in rows[1:]))
for s in ["Korthikanti", "Narayanan", "bigscience-workshop/bigscience", "mosaicml/llm-foundry", "pytorch/torchtitan"]:
    d = tempfile.mkdtemp()
    train = os.path.join(d, "train.csv"); test = os.path.join(d, "test.csv")
    csv.writer(open(train, "w")).writerows([h] + [r for r in rows[1:] if key(r) != s])
    csv.writer(open(test, "w")).writerows([h] + [r for r in rows[1:] if key(r) == s])
    out = subprocess.run(["/usr/bin/python3", os.path.join(root, "fit_calibration.py"), exe, train],
                         capture_output=True, text=True).stdout
    best = ast.literal_eval(re.search(r"best: (\{.*\})", out).group(1))
    # evaluate the held-out source with the fitted values
    tmp = tempfile.mkdtemp(); shutil.copytree(os.path.join(root, "clusters"), os.path.join(tmp, "clusters"))
    text = open(os.path.join(root, "devices.toml")).read()
    for fam, names in {"a100": ["a100-40g", "a100-80g"], "h100": ["h100-sxm", "h100-96g", "h200"]}.items():
        for n in names:
            text = re.sub(r"(\[%s\][^\[]*?gemm_efficiency = )[0-9.]+" % re.escape(n),
                          lambda m: m.group(1) + "%.4f" % best["eff_" + fam], text, flags=re.S)
    open(os.path.join(tmp, "devices.toml"), "w").write(text)
    cal = [f"--cal={k}={v}" for k, v in best.items() if not k.startswith("eff_")]
    res = subprocess.run([exe, "validate", test] + cal, capture_output=True, text=True,
                         env=dict(os.environ, EXATRAIN_CATALOG=tmp)).stdout
    print(s, "held out:", res.strip().splitlines()[-1], "| fit on the rest:", re.search(r"mape ([0-9.]+)", out).group(1), best, flush=True)
