#!/usr/bin/python3
"""tools/check aarch64, per emulated CPU model: the cross-built `cpuattn run` CLI under qemu.

usage: aarch64-cli-check.py <cpuattn binary> <expected target>   (QEMU_CPU names the model)

For f32, bf16 and f16 inputs (odd sizes, GQA, causal and unmasked), runs the fast path with
CPUATTN_VERBOSE=1 and the float64 reference (`--reference`, on the same rounded inputs), checks
that the verbose line names the expected target and that every output element is within
docs/precision.md's bound for the f32 path, which is what runs on ARM for every dtype (p = 0):
  |out - ref| <= max|v| * (8 eps (sqrt(Lk) + sqrt(D) S) + 1e-6),  S = 3 sqrt(D) scale max|q| max|k| + 3
per head, eps = 2^-23. On failure prints the worst element.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

EPS = 2.0**-23


def run(cli, args, env=None):
    r = subprocess.run(["qemu-aarch64-static", cli, "run", *args], capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"cpuattn run {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r.stderr


def rounded(x, dtype):
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bf16":  # round to nearest even on the upper 16 bits
        b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
        return b.astype(np.uint32).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def check(cli, expected, dtype, mask, shapes, seed, tmp):
    (B, H, Lq, D), Hkv, Lk, Dv = shapes
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Lk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, Lk, Dv)).astype(np.float32)
    paths = {n: os.path.join(tmp, n + ".npy") for n in ("q", "k", "v", "fast", "ref")}
    for n, a in (("q", q), ("k", k), ("v", v)):
        np.save(paths[n], a)
    common = ["--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--dtype", dtype]
    if mask:
        common += ["--mask", mask]
    verbose = run(cli, common + ["--out", paths["fast"]], dict(os.environ, CPUATTN_VERBOSE="1"))
    if f"target={expected}," not in verbose:
        sys.exit(f"expected target={expected} in the verbose line, got: {verbose.strip()}")
    run(cli, common + ["--reference", "--out", paths["ref"]])
    out, ref = np.load(paths["fast"]).astype(np.float64), np.load(paths["ref"]).astype(np.float64)
    qr, kr, vr = rounded(q, dtype), rounded(k, dtype), rounded(v, dtype)
    scale = 1.0 / np.sqrt(D)
    group = H // Hkv
    worst = (-1.0, None)
    for b in range(B):
        for h in range(H):
            kv = h // group
            s = 3 * np.sqrt(D) * scale * np.abs(qr[b, h]).max() * np.abs(kr[b, kv]).max() + 3
            bound = np.abs(vr[b, kv]).max() * (8 * EPS * (np.sqrt(Lk) + np.sqrt(D) * s) + 1e-6)
            err = np.abs(out[b, h] - ref[b, h])
            i = np.unravel_index(np.argmax(err), err.shape)
            if err[i] / bound > worst[0]:
                worst = (err[i] / bound, (b, h, *i), out[b, h][i], ref[b, h][i], bound)
    ratio, where, got, want, bound = worst
    label = f"{dtype} mask={mask or 'none'} q{B}x{H}x{Lq}x{D} kv{Hkv}x{Lk}x{Dv}"
    if not ratio <= 1.0:
        sys.exit(f"FAIL {label}: worst element {where}: {got} vs reference {want}, bound {bound}")
    print(f"ok {label}: target={expected}, worst error {ratio:.3f} of the bound")


def main():
    cli, expected = sys.argv[1], sys.argv[2]
    cases = [  # ((B, H, Lq, D), Hkv, Lk, Dv): odd and tail sizes, GQA, Dv != D
        ((2, 4, 37, 24), 2, 53, 24),
        ((1, 3, 130, 67), 3, 261, 33),
        ((3, 8, 1, 128), 2, 517, 128),  # a decoding step
    ]
    with tempfile.TemporaryDirectory() as tmp:
        seed = 7
        for dtype in ("f32", "bf16", "f16"):
            for mask in (None, "causal"):
                for shapes in cases:
                    check(cli, expected, dtype, mask, shapes, seed, tmp)
                    seed += 1


if __name__ == "__main__":
    main()
