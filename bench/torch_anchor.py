#!/usr/bin/env python3
"""PyTorch anchor for `npm run bench`: the bench's GPT-2-small shape (12 layers, d_model 768,
12 heads, d_mlp 3072, vocab 50257, random float32 weights) run forward on the CPU with every hook
kept, as TransformerLens's run_with_cache does (each hook's tensor stored in a dict, nothing
copied), at T = 16 and 128, batch 1.

Each thread configuration (torch intra-op threads x OpenBLAS threads, default 1x2, 2x1, 1x1) runs in
its own child process, since OpenBLAS reads its thread count when it loads. The children run with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from their environment (a machine may set them for
old OpenBLAS builds; they hold a current one back), so OpenBLAS picks its kernel for the CPU itself;
each child reports the kernel that ran (openblas_get_corename / openblas_get_config of the loaded
library) and torch.__config__.show()'s BLAS line.

Prints one JSON object on stdout: {"torch", "blas", "openblas": {"corename", "config", "library"},
"n_hooks", "env_unset", "configs": {"<t>x<b>": {"torch_threads", "openblas_threads"}}, "best": {"<T>":
{"config", "median_ms"}}, "runs": {"<t>x<b>": {"<T>": {"median_ms", "min_ms", "samples_ms"}}}}. Needs
python3-torch (Debian: apt-get install python3-torch libopenblas0-pthread); exits 3 with a message on
stderr when torch is missing, 4 when its BLAS is not OpenBLAS (the reference BLAS is no anchor).
Not part of npm test.

Usage: torch_anchor.py [--reps N] [--warmup N] [--configs 1x2,2x1,1x1] [--T 16,128]
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
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


# set for old OpenBLAS builds on some machines; unset in the children so OpenBLAS detects the CPU
UNSET_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def openblas_info():
    """the OpenBLAS this process loaded (found in /proc/self/maps), asked through ctypes"""
    info = {"library": None, "corename": None, "config": None, "threads": None}
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "openblas" in line.lower() or "libblas" in line.lower()})
    except OSError:
        libs = []
    for lib in libs:
        try:
            h = ctypes.CDLL(lib)
        except OSError:
            continue
        if not hasattr(h, "openblas_get_corename"):
            continue
        h.openblas_get_corename.restype = ctypes.c_char_p
        h.openblas_get_config.restype = ctypes.c_char_p
        info.update(library=lib, corename=h.openblas_get_corename().decode(), config=h.openblas_get_config().decode().strip(), threads=h.openblas_get_num_threads())
        break
    if info["library"] is None and libs:
        info["library"] = ", ".join(libs)
    return info


def run_config(torch_threads, openblas_threads, Ts, reps, warmup):
    """one configuration in this process: the child side"""
    torch.set_num_threads(torch_threads)
    w = make_weights()
    runs = {}
    n_hooks = None
    with torch.inference_mode():
        for T in Ts:
            ids = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(T))
            for _ in range(warmup):
                forward_with_cache(w, ids)
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter()
                _, cache = forward_with_cache(w, ids)
                samples.append((time.perf_counter() - t0) * 1000)
            n_hooks = len(cache)
            runs[str(T)] = {"median_ms": statistics.median(samples), "min_ms": min(samples), "samples_ms": [round(s, 2) for s in samples]}
            sys.stderr.write(f"  [torch] torch {torch_threads} x OpenBLAS {openblas_threads} threads, T={T}: {statistics.median(samples):.1f} ms\n")
    blas = "unknown"
    try:
        # the build's BLAS and whether oneDNN is in (its float32 matmuls still go to BLAS in torch 1.x)
        keys = ("BLAS_INFO", "LAPACK_INFO", "USE_MKLDNN", "USE_OPENMP")
        cfg = torch.__config__.show().replace(",", " ").split()
        blas = " ".join(t for t in cfg if t.split("=")[0] in keys) or blas
    except Exception:
        pass
    ob = openblas_info()
    return {
        "torch": torch.__version__, "blas": blas, "openblas": ob, "n_hooks": n_hooks,
        "torch_threads": torch.get_num_threads(), "openblas_threads": ob["threads"],
        "env": {k: os.environ.get(k) for k in UNSET_ENV + ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
        "runs": runs,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--configs", default="1x2,2x1,1x1", help="torch intra-op threads x OpenBLAS threads")
    ap.add_argument("--T", default="16,128")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    Ts = [int(x) for x in a.T.split(",")]
    if a.child:
        t, b = (int(x) for x in a.child.split("x"))
        json.dump(run_config(t, b, Ts, a.reps, a.warmup), sys.stdout)
        sys.stdout.write("\n")
        return
    out = {"batch": 1, "env_unset": list(UNSET_ENV), "configs": {}, "runs": {}, "best": {}}
    for cfg in a.configs.split(","):
        t, b = (int(x) for x in cfg.split("x"))
        env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
        env.update(OPENBLAS_NUM_THREADS=str(b), OMP_NUM_THREADS=str(t))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", cfg, "--reps", str(a.reps), "--warmup", str(a.warmup), "--T", a.T]
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            out["configs"][cfg] = {"torch_threads": t, "openblas_threads": b, "error": f"exit {r.returncode}"}
            continue
        c = json.loads(r.stdout)
        for k in ("torch", "blas", "openblas", "n_hooks"):
            out.setdefault(k, c[k])
        out["configs"][cfg] = {"torch_threads": c["torch_threads"], "openblas_threads": c["openblas_threads"], "corename": c["openblas"]["corename"], "env": c["env"]}
        out["runs"][cfg] = c["runs"]
        for T, x in c["runs"].items():
            if T not in out["best"] or x["median_ms"] < out["best"][T]["median_ms"]:
                out["best"][T] = {"config": cfg, "median_ms": x["median_ms"]}
    if not out["runs"]:
        sys.stderr.write("every thread configuration failed\n")
        sys.exit(1)
    if not out["openblas"]["corename"]:
        # Debian's reference BLAS (libblas3) runs these matmuls many times slower: not an anchor
        sys.stderr.write(f"torch's BLAS is not OpenBLAS ({out['openblas']['library']}): apt-get install libopenblas0-pthread\n")
        sys.exit(4)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
