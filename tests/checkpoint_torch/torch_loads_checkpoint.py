#!/usr/bin/python3
"""PyTorch reads our checkpoint's model.safetensors and reproduces our logits.

The safetensors layout is parsed here in a few lines (8-byte little-endian header length, JSON
header, raw little-endian data), exactly as any reader would; the model is the independent
PyTorch definition in tests/reference/golden_test.py. Fails when the max relative error of the
logits exceeds 1e-4.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from golden_test import gpt_forward  # noqa: E402

DTYPES = {"F32": np.float32}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.tensor(a.astype(np.float64))
    return out


def main():
    driver, workdir, variant = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.run([driver, workdir, variant], check=True)
    cfg = json.load(open(os.path.join(workdir, "config.json")))
    P = read_safetensors(os.path.join(cfg["checkpoint"], "model.safetensors"))
    T, V = cfg["seq_len"], cfg["vocab"]
    tokens = torch.tensor(np.fromfile(os.path.join(workdir, "tokens.bin"), np.int32).astype(np.int64)).view(1, T)
    ref = gpt_forward(P, cfg, tokens).detach().numpy().reshape(-1)
    ours = np.fromfile(os.path.join(workdir, "logits.bin"), np.float32).astype(np.float64)
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
    print(f"{variant}: {len(P)} tensors read from model.safetensors; logits max rel err {err:.2e}")
    if not err <= 1e-4:
        print("FAIL: PyTorch on our checkpoint does not reproduce our logits")
        sys.exit(1)


if __name__ == "__main__":
    main()
