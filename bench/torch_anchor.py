#!/usr/bin/env python3
"""PyTorch anchor for `npm run bench`: the bench's GPT-2-small shape (12 layers, d_model 768,
12 heads, d_mlp 3072, vocab 50257, random float32 weights) run forward on the CPU with every hook
kept, as TransformerLens's run_with_cache does (each hook's tensor stored in a dict, nothing
copied), at T = 16 and 128, batch 1, with 1 and 2 intra-op threads.

Prints one JSON object on stdout: {"torch": version, "blas": ..., "runs": {"<threads>": {"<T>":
{"median_ms", "min_ms", "samples_ms"}}}}. Needs python3-torch (Debian: apt-get install python3-torch
libopenblas0-pthread); exits 3 with a message on stderr when torch is missing. Not part of npm test.

Usage: torch_anchor.py [--reps N] [--warmup N] [--threads 1,2] [--T 16,128]
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
except ImportError:
    sys.stderr.write("torch is not installed (apt-get install python3-torch libopenblas0-pthread)\n")
    sys.exit(3)

L, D, H, M, V, NPOS = 12, 768, 12, 3072, 50257, 1024
DH = D // H


def make_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std: torch.randn(*s, generator=g) * std
    w = {"wte": r(V, D, std=0.1), "wpe": r(NPOS, D, std=0.05), "lnf_w": 1 + r(D, std=0.1), "lnf_b": r(D, std=0.02), "layers": []}
    for _ in range(L):
        w["layers"].append({
            "ln1_w": 1 + r(D, std=0.1), "ln1_b": r(D, std=0.02),
            "W_qkv": r(D, 3 * D, std=1 / math.sqrt(D)), "b_qkv": r(3 * D, std=0.02),
            "W_O": r(D, D, std=1 / math.sqrt(D) / 4), "b_O": r(D, std=0.02),
            "ln2_w": 1 + r(D, std=0.1), "ln2_b": r(D, std=0.02),
            "W_in": r(D, M, std=1 / math.sqrt(D)), "b_in": r(M, std=0.02),
            "W_out": r(M, D, std=1 / math.sqrt(M) / 4), "b_out": r(D, std=0.02),
        })
    return w


def layer_norm(x, w, b, name, cache, eps=1e-5):
    # TransformerLens LayerNorm: hook_scale and hook_normalized
    x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    cache[f"{name}.hook_scale"] = scale
    x = x / scale
    cache[f"{name}.hook_normalized"] = x
    return x * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward_with_cache(w, ids):
    """GPT-2 forward storing every TransformerLens hook of the model (run_with_cache)."""
    cache = {}
    B, T = ids.shape
    embed = w["wte"][ids]
    cache["hook_embed"] = embed
    pos = w["wpe"][:T].unsqueeze(0)
    cache["hook_pos_embed"] = pos
    resid = embed + pos
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l, p in enumerate(w["layers"]):
        b = f"blocks.{l}"
        cache[f"{b}.hook_resid_pre"] = resid
        x = layer_norm(resid, p["ln1_w"], p["ln1_b"], f"{b}.ln1", cache)
        qkv = x @ p["W_qkv"] + p["b_qkv"]
        q, k, v = (t.view(B, T, H, DH) for t in qkv.split(D, dim=-1))
        cache[f"{b}.attn.hook_q"], cache[f"{b}.attn.hook_k"], cache[f"{b}.attn.hook_v"] = q, k, v
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(DH) + mask
        cache[f"{b}.attn.hook_attn_scores"] = scores
        pattern = scores.softmax(-1)
        cache[f"{b}.attn.hook_pattern"] = pattern
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        cache[f"{b}.attn.hook_z"] = z
        attn_out = z.reshape(B, T, D) @ p["W_O"] + p["b_O"]
        cache[f"{b}.hook_attn_out"] = attn_out
        resid = resid + attn_out
        cache[f"{b}.hook_resid_mid"] = resid
        x = layer_norm(resid, p["ln2_w"], p["ln2_b"], f"{b}.ln2", cache)
        pre = x @ p["W_in"] + p["b_in"]
        cache[f"{b}.mlp.hook_pre"] = pre
        post = gelu_new(pre)
        cache[f"{b}.mlp.hook_post"] = post
        mlp_out = post @ p["W_out"] + p["b_out"]
        cache[f"{b}.hook_mlp_out"] = mlp_out
        resid = resid + mlp_out
        cache[f"{b}.hook_resid_post"] = resid
    x = layer_norm(resid, w["lnf_w"], w["lnf_b"], "ln_final", cache)
    logits = x @ w["wte"].T
    return logits, cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--T", default="16,128")
    a = ap.parse_args()
    w = make_weights()
    runs = {}
    n_hooks = None
    with torch.inference_mode():
        for threads in [int(x) for x in a.threads.split(",")]:
            torch.set_num_threads(threads)
            runs[str(threads)] = {}
            for T in [int(x) for x in a.T.split(",")]:
                ids = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(T))
                for _ in range(a.warmup):
                    forward_with_cache(w, ids)
                samples = []
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    _, cache = forward_with_cache(w, ids)
                    samples.append((time.perf_counter() - t0) * 1000)
                n_hooks = len(cache)
                runs[str(threads)][str(T)] = {"median_ms": statistics.median(samples), "min_ms": min(samples), "samples_ms": [round(s, 2) for s in samples]}
                sys.stderr.write(f"  [torch] threads={threads} T={T}: {statistics.median(samples):.1f} ms\n")
    blas = "unknown"
    try:
        cfg = torch.__config__.show()
        blas = next((line.strip() for line in cfg.splitlines() if "BLAS" in line), blas)
    except Exception:
        pass
    json.dump({"torch": torch.__version__, "blas": blas, "n_hooks": n_hooks, "batch": 1, "runs": runs}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
