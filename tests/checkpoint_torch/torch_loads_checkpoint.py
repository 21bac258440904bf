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

import torch.nn.functional as F  # noqa: E402


def bf16_to_f32(raw):
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


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
        raw = data[b:e]
        a = np.frombuffer(raw, np.float32) if t["dtype"] == "F32" else bf16_to_f32(raw)
        a = a.reshape(t["shape"])
        out[name] = torch.tensor(a.astype(np.float64))
    return out


def hf_gpt2_forward(S, c, tokens):
    """transformers' GPT2LMHeadModel, written from its conventions (Conv1D: y = x W + b)."""
    T = tokens.shape[1]
    H, C = c["n_head"], c["n_embd"]
    D = C // H
    x = S["transformer.wte.weight"][tokens] + S["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    ln = lambda x, p: F.layer_norm(x, (C,), S[p + ".weight"], S[p + ".bias"], c["layer_norm_epsilon"])
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}."
        qkv = ln(x, p + "ln_1") @ S[p + "attn.c_attn.weight"] + S[p + "attn.c_attn.bias"]
        q, k, v = (t.view(1, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = ((q @ k.transpose(-1, -2)) / D ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(1, T, C)
        x = x + y @ S[p + "attn.c_proj.weight"] + S[p + "attn.c_proj.bias"]
        h = F.gelu(ln(x, p + "ln_2") @ S[p + "mlp.c_fc.weight"] + S[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ S[p + "mlp.c_proj.weight"] + S[p + "mlp.c_proj.bias"]
    x = ln(x, "transformer.ln_f")
    return x @ S.get("lm_head.weight", S["transformer.wte.weight"]).T


def hf_llama_to_ours(S):
    """LlamaForCausalLM names -> ours (both store torch.nn.Linear [out, in] weights)."""
    P = {}
    for n, t in S.items():
        n = n.replace("model.embed_tokens.", "wte.").replace("model.norm.", "ln_f.").replace("model.layers.", "h.")
        n = n.replace("input_layernorm", "ln_1").replace("post_attention_layernorm", "ln_2").replace("self_attn", "attn")
        P[n] = t
    return P


def compare(what, ours, ref, tol):
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
    print(f"{what}: logits max rel err {err:.2e} (tolerance {tol:.0e})")
    return err <= tol


def main():
    driver, workdir, variant = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.run([driver, workdir, variant], check=True)
    cfg = json.load(open(os.path.join(workdir, "config.json")))
    P = read_safetensors(os.path.join(cfg["checkpoint"], "model.safetensors"))
    T, V = cfg["seq_len"], cfg["vocab"]
    tokens = torch.tensor(np.fromfile(os.path.join(workdir, "tokens.bin"), np.int32).astype(np.int64)).view(1, T)
    ref = gpt_forward(P, cfg, tokens).detach().numpy().reshape(-1)
    ours = np.fromfile(os.path.join(workdir, "logits.bin"), np.float32).astype(np.float64)
    print(f"{variant}: {len(P)} tensors read from the checkpoint's model.safetensors")
    ok = compare(f"{variant} checkpoint", ours, ref, 1e-4)
    # The Hugging Face exports, read by the transformers-convention forward.
    for dtype, tol in (("fp32", 1e-4), ("bf16", 1e-2)):
        hf = os.path.join(workdir, "hf_" + dtype)
        S = read_safetensors(os.path.join(hf, "model.safetensors"))
        c = json.load(open(os.path.join(hf, "config.json")))
        if variant == "gpt2":
            assert c["model_type"] == "gpt2"
            got = hf_gpt2_forward(S, c, tokens)
        else:
            assert c["model_type"] == "llama" and c["num_key_value_heads"] == cfg["kv_heads"]
            # transformers loads linear biases only when the config says so; none without them
            assert c["attention_bias"] == c["mlp_bias"] == cfg["bias"], (c["attention_bias"], cfg["bias"])
            assert cfg["bias"] or not any(n.endswith("_proj.bias") for n in S), sorted(S)
            got = gpt_forward(hf_llama_to_ours(S), cfg, tokens)
        ok &= compare(f"{variant} hf export {dtype}", got.detach().numpy().reshape(-1), ours, tol)
    if not ok:
        print("FAIL: PyTorch on our checkpoint or export does not reproduce our logits")
        sys.exit(1)


if __name__ == "__main__":
    main()
