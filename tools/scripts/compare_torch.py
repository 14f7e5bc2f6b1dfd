#!/usr/bin/env -S /usr/bin/python3
"""cpuattn against torch's scaled_dot_product_attention, in one process, on the named shapes.

Run with the interpreter the module is built for, the module's directory on PYTHONPATH:
    PYTHONPATH=build/release/python tools/scripts/compare_torch.py [--shapes S1,P2]
                                                                    [--threads 1,2] [--repeat 5]
(or /usr/bin/python3 tools/scripts/compare_torch.py ...). Prints a markdown table.

For each shape and thread count: both sides are run once and their outputs compared (max abs
difference, printed), then timed `--repeat` times, interleaved (cpuattn, torch, cpuattn, ...), and
the best time of each is reported. flops = 2 * (D + Dv) * H * B * (visible query/key pairs).
Threads: torch.set_num_threads(n) for torch, threads=n (a cached cpuattn.Context of n threads)
for cpuattn. Inputs are float32 [B, H, L, D] arrays shared by both sides (torch.from_numpy: no
copy); each side allocates its output, as a caller would.

torch before 2.0 (Debian's 1.13) has only the private F._scaled_dot_product_attention (no scale
argument, no grouped-query heads, top-left is_causal) and computes it unfused. For grouped-query
shapes torch gets K/V with their heads repeated H/Hkv times (repeat_interleave, done once,
outside the timed region); cpuattn reads the Hkv heads directly.

Debian's torch 1.13 does its matrix products through the system BLAS (libblas.so.3): with only
the reference BLAS installed they run at a few GFLOP/s, so install an optimized one
(libopenblas0-pthread) for a fair comparison; the header line names the BLAS found. Thread pools
that spin after their work (OpenMP's, OpenBLAS's, oneTBB's) would steal the other side's cores
in an interleaved run: OpenMP is asked to wait passively, OpenBLAS gets the same thread count as
torch, and each side's timed call starts after a short pause.
"""
import argparse
import ctypes
import math
import os
import subprocess
import sys
import time

import numpy as np

try:
    import cpuattn
except ImportError as e:
    sys.exit(f"compare_torch: cannot import cpuattn ({e}); put the build's python/ directory "
             "on PYTHONPATH, e.g. PYTHONPATH=build/release/python")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"compare_torch: torch not installed ({e}); on Debian: apt-get install python3-torch")

# OpenBLAS's own thread pool (the pthread build) ignores torch.set_num_threads.
_PROCESS = ctypes.CDLL(None)
_OPENBLAS_SET_THREADS = getattr(_PROCESS, "openblas_set_num_threads", None)


def blas_name():
    """The BLAS behind libblas.so.3 as this process loaded it."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libblas" in line or "openblas" in line}
    except OSError:
        return "unknown"
    return ", ".join(sorted(os.path.realpath(p) for p in paths if p.startswith("/"))) or "unknown"


def set_threads(n):
    torch.set_num_threads(n)
    if _OPENBLAS_SET_THREADS is not None:
        _OPENBLAS_SET_THREADS(n)


# name: B, H, Hkv, Lq, Lk, D, Dv, causal
SHAPES = {
    "S1": (32, 12, 12, 128, 128, 64, 64, False),
    "P1": (1, 16, 16, 2048, 2048, 64, 64, False),
    "P2": (1, 16, 16, 2048, 2048, 128, 128, True),
    "X1": (8, 8, 8, 64, 1024, 64, 64, False),
    "D1": (4, 32, 8, 1, 4096, 128, 128, False),
}


def torch_sdpa():
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)
    return lambda q, k, v, c: F._scaled_dot_product_attention(q, k, v, is_causal=c)[0]


def visible_pairs(Lq, Lk, causal):
    if not causal:
        return Lq * Lk
    # top-left: query i sees keys j <= i
    return sum(min(i + 1, Lk) for i in range(Lq))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of " +
                    ", ".join(f"{k}" for k in SHAPES))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per side (best is kept)")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for n in names:
        if n not in SHAPES:
            ap.error(f"unknown shape {n!r}; known: {', '.join(SHAPES)}")
    threads = [int(t) for t in args.threads.split(",")]
    sdpa = torch_sdpa()

    print(f"CPU: {cpu_model()}; cpuattn {cpuattn.__version__} target "
          f"{cpuattn.active_target()}; torch {torch.__version__}; numpy {np.__version__}")
    print(f"torch's BLAS: {blas_name()}")
    print(f"best of {args.repeat}, interleaved; float32\n")
    print("| shape | B H/Hkv Lq Lk D | threads | cpuattn ms | torch ms | torch/cpuattn | "
          "cpuattn GFLOP/s | torch GFLOP/s | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for name in names:
        B, H, Hkv, Lq, Lk, D, Dv, causal = SHAPES[name]
        q = rng.standard_normal((B, H, Lq, D), dtype=np.float32)
        k = rng.standard_normal((B, Hkv, Lk, D), dtype=np.float32)
        v = rng.standard_normal((B, Hkv, Lk, Dv), dtype=np.float32)
        tq, tk, tv = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
        if Hkv != H:  # torch 1.13 has no GQA: repeat K/V heads, outside the timed region
            tk = tk.repeat_interleave(H // Hkv, dim=1).contiguous()
            tv = tv.repeat_interleave(H // Hkv, dim=1).contiguous()
        flops = 2.0 * (D + Dv) * H * B * visible_pairs(Lq, Lk, causal)
        for n in threads:
            set_threads(n)
            with torch.inference_mode():
                ref = sdpa(tq, tk, tv, causal).numpy()
            out = cpuattn.attention(q, k, v, is_causal=causal, threads=n)
            diff = float(np.max(np.abs(out - ref)))
            best_c = best_t = math.inf
            for _ in range(args.repeat):
                time.sleep(0.1)
                t0 = time.perf_counter()
                cpuattn.attention(q, k, v, is_causal=causal, threads=n)
                best_c = min(best_c, time.perf_counter() - t0)
                time.sleep(0.1)
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    sdpa(tq, tk, tv, causal)
                    best_t = min(best_t, time.perf_counter() - t0)
            hkv = f"{H}/{Hkv}" if Hkv != H else f"{H}"
            desc = f"{B} {hkv} {Lq} {Lk} {D}" + (" causal" if causal else "")
            print(f"| {name} | {desc} | {n} | {best_c * 1e3:.3f} | {best_t * 1e3:.3f} | "
                  f"{best_t / best_c:.2f} | {flops / best_c / 1e9:.1f} | "
                  f"{flops / best_t / 1e9:.1f} | {diff:.1e} |", flush=True)
    if any(SHAPES[n][1] != SHAPES[n][2] for n in names):
        print("\nGQA shapes: torch is given K/V with heads repeated (no GQA in its SDPA); the "
              "repeat is not timed.")


if __name__ == "__main__":
    main()
