"""Cross-checks our safetensors files with PyTorch, reading the layout by hand (8-byte
little-endian header length, JSON header, raw data) since Debian ships no safetensors module.

  safetensors_torch.py check PATH   -- verify a file written by tests/checkpoint (C++)
  safetensors_torch.py write PATH   -- write a reference file for the C++ reader to verify
"""
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16}


def pattern(n):
    # The same values as the C++ test: float((i * 37) % 1001 - 500) / 7.0f, in float32 throughout.
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 37) % 1001 - 500).to(torch.float32) / 7.0


SPECIALS = [1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, math.inf, -math.inf, 3.4028234e38,
            1e-40, -2.5e-39, 65504.0, 0.1, math.nan]


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        raw = bytearray(data[begin:end])
        tensors[name] = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, meta


def check(path):
    tensors, meta = read(path)
    assert meta.get("format") == "pt", meta
    a = tensors["a.f32"]
    assert a.dtype == torch.float32 and list(a.shape) == [3, 5, 7]
    assert torch.equal(a.flatten(), pattern(105)), "a.f32 values differ"
    b = tensors["b.bf16"]
    assert b.dtype == torch.bfloat16 and list(b.shape) == [64, 33]
    ref = pattern(64 * 33).to(torch.bfloat16)  # PyTorch rounds to nearest even
    assert torch.equal(b.flatten().view(torch.int16), ref.view(torch.int16)), "b.bf16 rounding"
    c = tensors["c.bf16"]
    ref = torch.tensor(SPECIALS, dtype=torch.float32).to(torch.bfloat16)
    ours, theirs = c.view(torch.int16), ref.view(torch.int16)
    for k, x in enumerate(SPECIALS):
        if math.isnan(x):
            assert torch.isnan(c[k].float()), "NaN must stay NaN"
        else:
            assert ours[k] == theirs[k], f"bf16({x!r}): ours {int(ours[k]) & 0xffff:#06x}, " \
                                         f"torch {int(theirs[k]) & 0xffff:#06x}"
    slices = json.loads(meta["exatrain.slices"])
    assert slices["a.f32"] == {"global_shape": [3, 5, 7], "offset": [0, 0, 0]}, slices
    print("python: OK", sorted(tensors))


def write(path):
    tensors = {
        "x.f32": torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.5 - 3,
        "y.bf16": torch.tensor([1.5, -2.25, 1e-3, 1000.0], dtype=torch.float32).to(torch.bfloat16),
    }
    header, chunks, offset = {"__metadata__": {"writer": "python"}}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        dtype = {torch.float32: "F32", torch.bfloat16: "BF16"}[t.dtype]
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


if __name__ == "__main__":
    {"check": check, "write": write}[sys.argv[1]](sys.argv[2])
