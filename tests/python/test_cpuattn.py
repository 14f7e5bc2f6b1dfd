"""Tests of the Python module `cpuattn` (lib/python/).

Run with the interpreter the module is built for, the module's directory on PYTHONPATH:
    PYTHONPATH=build/release/python /usr/bin/python3 -m pytest -q -rs tests/python
(ctest runs exactly that as `python_tests`).
"""
import math
import os
import sys
import threading
import time

import numpy as np
import pytest

import cpuattn


# ---------------------------------------------------------------------------------------------
# A float64 NumPy implementation of the semantics (docs/api.md, "Semantics").


def np_attention(q, k, v, mask=None, causal=None, scale=None, key_lengths=None,
                 window_size=None, softcap=0.0, alibi_slopes=None, sinks=None):
    """out [B, H, Lq, Dv] and lse [B, H, Lq] in float64; causal None|'top_left'|'bottom_right';
    the variants in the documented order: soft-cap, ALiBi, masks and window, sinks."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = H // Hkv
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    allowed = np.ones((B, H, Lq, Lk), dtype=bool)
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    pos = i + Lk - Lq
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s - np.asarray(alibi_slopes, np.float64)[None, :, None, None] * np.abs(pos - j)
    if window_size is not None:
        left, right = window_size
        if left >= 0:
            allowed &= j >= pos - left
        if right >= 0:
            allowed &= j <= pos + right
    if causal == "top_left":
        allowed &= j <= i
    elif causal == "bottom_right":
        allowed &= j <= i + Lk - Lq
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed &= np.broadcast_to(mask, allowed.shape)
        else:
            s = s + np.broadcast_to(mask.astype(np.float64), s.shape)
    if key_lengths is not None:
        allowed &= (j[None, None] < np.asarray(key_lengths)[:, None, None, None])
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    sink = None
    if sinks is not None:
        sink = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], m.shape)
        m = np.maximum(m, sink)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.where(allowed, np.exp(s - m_safe), 0.0)
    z = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        z = z + np.exp(sink - m_safe)
    out = np.einsum("bhij,bhjd->bhid", p / np.where(z > 0, z, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(z) + m_safe)[..., 0]
    lse = np.where(z[..., 0] > 0, lse, -np.inf)
    return out, lse


def tol(Lk, scale=1.0):
    """float32 kernel vs float64: error grows like sqrt(Lk) (sums of Lk rounded terms)."""
    return 2e-6 * math.sqrt(Lk) * scale + 1e-6


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------
# Correctness against NumPy float64.

CASES = [
    # name, B, H, Hkv, Lq, Lk, D, Dv
    ("tiny", 1, 1, 1, 1, 1, 1, 1),
    ("odd", 2, 3, 3, 7, 13, 5, 9),
    ("gqa", 2, 8, 2, 17, 33, 16, 16),
    ("mqa", 1, 4, 1, 5, 70, 32, 24),
    ("dv_ne_d", 3, 2, 2, 31, 31, 24, 40),
    ("cross", 2, 4, 4, 3, 257, 64, 64),
    ("long", 1, 2, 1, 65, 517, 128, 64),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_matches_numpy(case, causal):
    name, B, H, Hkv, Lq, Lk, D, Dv = case
    rng = np.random.default_rng(abs(hash((name, causal))) % 2**32)
    q, k, v = rand(rng, B, H, Lq, D), rand(rng, B, Hkv, Lk, D), rand(rng, B, Hkv, Lk, Dv)
    is_causal = {None: False, "top_left": True, "bottom_right": "bottom_right"}[causal]
    out, lse = cpuattn.attention(q, k, v, is_causal=is_causal, return_lse=True)
    ref_out, ref_lse = np_attention(q, k, v, causal=causal)
    assert out.shape == (B, H, Lq, Dv) and out.dtype == np.float32
    assert lse.shape == (B, H, Lq) and lse.dtype == np.float32
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol(Lk))
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-5, atol=tol(Lk))
    # The library's own double-precision oracle agrees too.
    ref2 = cpuattn.reference_attention(q, k, v, is_causal=is_causal)
    assert ref2.dtype == np.float64
    np.testing.assert_allclose(ref2, ref_out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mask_rank", [2, 3, 4])
def test_bool_and_float_masks(mask_rank):
    rng = np.random.default_rng(10 + mask_rank)
    B, H, Hkv, Lq, Lk, D, Dv = 2, 4, 2, 9, 21, 8, 12
    q, k, v = rand(rng, B, H, Lq, D), rand(rng, B, Hkv, Lk, D), rand(rng, B, Hkv, Lk, Dv)
    shape = [(Lq, Lk), (H, Lq, Lk), (B, 1, Lq, Lk)][mask_rank - 2]
    bmask = rng.random(shape) > 0.4
    out = cpuattn.attention(q, k, v, attn_mask=bmask)
    np.testing.assert_allclose(out, np_attention(q, k, v, mask=bmask)[0], atol=tol(Lk))
    fmask = rng.standard_normal(shape).astype(np.float32)
    fmask[~bmask] = -np.inf
    out = cpuattn.attention(q, k, v, attn_mask=fmask, scale=0.3)
    np.testing.assert_allclose(out, np_attention(q, k, v, mask=fmask, scale=0.3)[0], atol=tol(Lk))
    # Both masks and causal combine.
    out = cpuattn.attention(q, k, v, attn_mask=bmask, is_causal=True)
    ref = np_attention(q, k, v, mask=bmask, causal="top_left")[0]
    np.testing.assert_allclose(out, ref, atol=tol(Lk))


def test_fully_masked_row_is_zero_and_lse_minus_inf():
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8)
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, lse = cpuattn.attention(q, k, v, attn_mask=mask, return_lse=True)
    assert np.all(out[:, :, 1] == 0) and np.all(lse[:, :, 1] == -np.inf)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_key_lengths(dtype):
    rng = np.random.default_rng(4)
    B, H, Lq, Lk, D = 3, 2, 6, 19, 16
    q, k, v = rand(rng, B, H, Lq, D), rand(rng, B, H, Lk, D), rand(rng, B, H, Lk, D)
    lengths = np.array([19, 7, 0], dtype=dtype)
    out, lse = cpuattn.attention(q, k, v, key_lengths=lengths, return_lse=True)
    ref, ref_lse = np_attention(q, k, v, key_lengths=lengths)
    np.testing.assert_allclose(out, ref, atol=tol(Lk))
    assert np.all(out[2] == 0) and np.all(lse[2] == -np.inf)
    # A plain list works too.
    out2 = cpuattn.attention(q, k, v, key_lengths=[19, 7, 0])
    np.testing.assert_array_equal(out, out2)


def test_rank3_inputs():
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 4, 7, 8), rand(rng, 2, 9, 8), rand(rng, 2, 9, 5)
    out, lse = cpuattn.attention(q, k, v, is_causal=True, return_lse=True)
    assert out.shape == (4, 7, 5) and lse.shape == (4, 7)
    ref = np_attention(q[None], k[None], v[None], causal="top_left")[0][0]
    np.testing.assert_allclose(out, ref, atol=tol(9))


def test_float16_inputs_and_output():
    rng = np.random.default_rng(6)
    q, k, v = rand(rng, 2, 4, 11, 32), rand(rng, 2, 4, 40, 32), rand(rng, 2, 4, 40, 32)
    q16, k16, v16 = (t.astype(np.float16) for t in (q, k, v))
    ref = np_attention(q16, k16, v16)[0]
    out = cpuattn.attention(q16, k16, v16)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=2e-3)
    out32 = np.empty((2, 4, 11, 32), np.float32)
    res = cpuattn.attention(q16, k16, v16, out=out32)
    assert res is out32
    np.testing.assert_allclose(out32, ref, atol=tol(40))


def test_bf16_bit_patterns():
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, 1, 2, 9, 64), rand(rng, 1, 2, 30, 64), rand(rng, 1, 2, 30, 64)
    qb, kb, vb = (cpuattn.to_bf16(t) for t in (q, k, v))
    assert qb.dtype == np.uint16
    ref = np_attention(*(cpuattn.from_bf16(t) for t in (qb, kb, vb)))[0]
    out = np.empty((1, 2, 9, 64), np.float32)
    cpuattn.attention(qb, kb, vb, out=out, bf16=True)
    np.testing.assert_allclose(out, ref, atol=2e-2)  # P may be rounded to bf16 (avx512_bf16)
    with pytest.raises(ValueError, match=r"^cpuattn: q .*bf16=True"):
        cpuattn.attention(qb, kb, vb)


# ---------------------------------------------------------------------------------------------
# Against torch (the conventions the module follows).


def torch_sdpa():
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # ImportError, or a broken install
        pytest.skip(f"torch not installed: {type(e).__name__}: {e}")
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return torch, lambda q, k, v, m=None, c=False: F.scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=c)
    if hasattr(F, "_scaled_dot_product_attention"):  # torch 1.13: returns (out, weights)
        return torch, lambda q, k, v, m=None, c=False: F._scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=c)[0]
    pytest.skip(f"torch {torch.__version__} has no scaled_dot_product_attention")


TORCH_CASES = [
    # B, H, L q, Lk, D, Dv, causal, mask
    (2, 4, 16, 16, 32, 32, False, None),
    (2, 4, 33, 33, 64, 64, True, None),
    (1, 3, 7, 50, 16, 24, False, "bool"),
    (3, 2, 20, 20, 8, 8, False, "float"),
    (1, 8, 128, 128, 64, 64, True, None),
]


@pytest.mark.parametrize("case", TORCH_CASES)
def test_matches_torch(case):
    torch, sdpa = torch_sdpa()
    B, H, Lq, Lk, D, Dv, causal, mask_kind = case
    rng = np.random.default_rng(Lq * 1000 + Lk)
    q, k, v = rand(rng, B, H, Lq, D), rand(rng, B, H, Lk, D), rand(rng, B, H, Lk, Dv)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((Lq, Lk)) > 0.3
        mask[:, 0] = True  # torch gives NaN for fully masked rows
    elif mask_kind == "float":
        mask = rng.standard_normal((B, 1, Lq, Lk)).astype(np.float32)
    t = torch.from_numpy
    ref = sdpa(t(q), t(k), t(v), None if mask is None else t(mask), causal).numpy()
    out = cpuattn.attention(q, k, v, attn_mask=mask, is_causal=causal)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2 * tol(Lk))
    # torch tensors are accepted directly (NumPy views them without a copy).
    out_t = cpuattn.attention(t(q), t(k), t(v), attn_mask=None if mask is None else t(mask),
                              is_causal=causal)
    np.testing.assert_array_equal(out_t, out)


# ---------------------------------------------------------------------------------------------
# Zero copy, strides, GIL.


def test_out_is_written_in_place():
    rng = np.random.default_rng(8)
    q, k, v = rand(rng, 2, 4, 8, 16), rand(rng, 2, 4, 12, 16), rand(rng, 2, 4, 12, 16)
    out = np.full((2, 4, 8, 16), np.nan, np.float32)
    res = cpuattn.attention(q, k, v, out=out)
    assert res is out
    assert np.shares_memory(res, out)
    np.testing.assert_allclose(out, np_attention(q, k, v)[0], atol=tol(12))
    res, lse = cpuattn.attention(q, k, v, out=out, return_lse=True)
    assert res is out


def test_strided_views_without_copy():
    # Projections' [B, L, H, D] memory, viewed as [B, H, L, D] by a transpose: no copy.
    rng = np.random.default_rng(9)
    B, L, H, D = 2, 37, 4, 16
    qb, kb, vb = rand(rng, B, L, H, D), rand(rng, B, L, H, D), rand(rng, B, L, H, D)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (qb, kb, vb))
    assert not q.flags.c_contiguous and np.shares_memory(q, qb)
    out_blhd = np.zeros((B, L, H, D), np.float32)
    out = out_blhd.transpose(0, 2, 1, 3)
    res = cpuattn.attention(q, k, v, out=out, is_causal=True)
    assert res is out and np.shares_memory(res, out_blhd)
    ref = np_attention(q, k, v, causal="top_left")[0]
    np.testing.assert_allclose(out, ref, atol=tol(L))
    np.testing.assert_allclose(out_blhd, ref.transpose(0, 2, 1, 3), atol=tol(L))
    # Slices with a step in a leading dimension, and a slice of a wider last axis.
    wide = rand(rng, B, H, 2 * L, 2 * D)
    qs = wide[:, :, ::2, :D]
    res = cpuattn.attention(qs, k, v)
    np.testing.assert_allclose(res, np_attention(qs, k, v)[0], atol=tol(L))
    # Broadcast (stride 0) K/V batch.
    k1 = np.broadcast_to(rand(rng, 1, H, L, D), (B, H, L, D))
    res = cpuattn.attention(q, k1, v)
    np.testing.assert_allclose(res, np_attention(q, k1, v)[0], atol=tol(L))


def test_gil_released_during_attention():
    # A second Python thread runs while attention() computes. The switch interval is set far
    # longer than the call, so the other thread can only run if the call releases the GIL: no
    # timing threshold, and a machine with one core passes too.
    rng = np.random.default_rng(11)
    q = rand(rng, 1, 8, 1024, 64)
    k, v = rand(rng, 1, 8, 1024, 64), rand(rng, 1, 8, 1024, 64)
    cpuattn.attention(q, k, v, threads=1)  # warm up (context, scratch)
    state = {"in_call": False, "seen": 0, "done": False}

    def watcher():
        while not state["done"]:
            if state["in_call"]:
                state["seen"] += 1
            time.sleep(0.0002)  # releases the GIL, so the main thread gets it back at once

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    t = threading.Thread(target=watcher)
    try:
        t.start()
        for _ in range(3):
            state["in_call"] = True
            cpuattn.attention(q, k, v, threads=1)
            state["in_call"] = False
    finally:
        state["done"] = True
        t.join()
        sys.setswitchinterval(old)
    assert state["seen"] > 0, "no other Python thread ran during attention(): GIL held"


def test_threads_give_identical_results_and_run_concurrently():
    rng = np.random.default_rng(12)
    q, k, v = rand(rng, 2, 8, 200, 64), rand(rng, 2, 2, 300, 64), rand(rng, 2, 2, 300, 64)
    base = cpuattn.attention(q, k, v)
    results = {}

    def work(i):
        results[i] = cpuattn.attention(q, k, v, threads=1 + i % 2)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(4):  # results never depend on the thread count
        np.testing.assert_array_equal(results[i], base)
    ctx = cpuattn.Context(2)
    np.testing.assert_array_equal(cpuattn.attention(q, k, v, context=ctx), base)


# ---------------------------------------------------------------------------------------------
# Errors: ValueError ("cpuattn: ..." naming the argument), out untouched.


def _qkv(rng):
    return rand(rng, 2, 4, 5, 8), rand(rng, 2, 2, 7, 8), rand(rng, 2, 2, 7, 6)


@pytest.mark.parametrize(
    "name, make, pattern",
    [
        ("d mismatch", lambda q, k, v: dict(k=k[..., :4].copy()), r"\bK\b"),
        ("heads", lambda q, k, v: dict(q=q[:, :3].copy()), r"\bH"),
        ("mask shape", lambda q, k, v: dict(attn_mask=np.ones((5, 6), bool)), r"mask"),
        ("mask dtype", lambda q, k, v: dict(attn_mask=np.ones((5, 7), np.int32)), r"attn_mask"),
        ("key_lengths range", lambda q, k, v: dict(key_lengths=np.array([8, 1])), r"key.?lengths"),
        ("q float64", lambda q, k, v: dict(q=q.astype(np.float64)), r"^cpuattn: q "),
        ("q rank", lambda q, k, v: dict(q=q[0, 0]), r"^cpuattn: q "),
        ("last dim stride", lambda q, k, v: dict(v=np.repeat(v, 2, axis=-1)[..., ::2]),
         r"\bV\b"),
        ("negative stride", lambda q, k, v: dict(k=k[:, :, ::-1]), r"\bK\b"),
        ("scale", lambda q, k, v: dict(scale=-1.0), r"scale"),
        ("causal string", lambda q, k, v: dict(is_causal="sideways"), r"is_causal"),
        ("threads and context", lambda q, k, v: dict(threads=1, context=cpuattn.Context()),
         r"threads"),
    ],
)
def test_bad_input_raises_value_error_and_leaves_out(name, make, pattern):
    rng = np.random.default_rng(13)
    q, k, v = _qkv(rng)
    args = dict(q=q, k=k, v=v)
    args.update(make(q, k, v))
    out = np.full((2, 4, 5, 6), 42.0, np.float32)
    with pytest.raises(ValueError) as e:
        cpuattn.attention(args.pop("q"), args.pop("k"), args.pop("v"), out=out, **args)
    msg = str(e.value)
    assert msg.startswith("cpuattn: "), msg
    assert __import__("re").search(pattern, msg, __import__("re").I), msg
    assert isinstance(e.value, cpuattn.Error)
    assert np.all(out == 42.0)


def test_out_errors():
    rng = np.random.default_rng(14)
    q, k, v = _qkv(rng)
    ro = np.zeros((2, 4, 5, 6), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match=r"^cpuattn: out is read-only"):
        cpuattn.attention(q, k, v, out=ro)
    wrong = np.full((2, 4, 5, 7), 1.0, np.float32)
    with pytest.raises(ValueError, match=r"^cpuattn: .*out"):
        cpuattn.attention(q, k, v, out=wrong)
    assert np.all(wrong == 1.0)
    f64 = np.full((2, 4, 5, 6), 1.0)
    with pytest.raises(ValueError, match=r"^cpuattn: out has dtype float64"):
        cpuattn.attention(q, k, v, out=f64)
    # The output may not overlap an input.
    with pytest.raises(ValueError, match=r"^cpuattn: .*overlap"):
        cpuattn.attention(q, k, v, out=q.reshape(-1)[: 2 * 4 * 5 * 6].reshape(2, 4, 5, 6))


def test_stride_not_multiple_of_itemsize():
    buf = np.zeros(4096, np.uint8)
    q = np.ndarray((1, 1, 3, 4), np.float32, buffer=buf, offset=0, strides=(64, 64, 18, 4))
    k = np.zeros((1, 1, 3, 4), np.float32)
    out = np.full((1, 1, 3, 4), 5.0, np.float32)
    with pytest.raises(ValueError, match=r"^cpuattn: q has a stride of 18 bytes"):
        cpuattn.attention(q, k, k, out=out)
    assert np.all(out == 5.0)


# ---------------------------------------------------------------------------------------------
# Context and targets.


def test_context_and_targets():
    assert cpuattn.__version__ == "0.1.0"
    targets = cpuattn.supported_targets()
    assert targets and targets[-1] == "scalar"
    assert cpuattn.active_target() in targets
    assert cpuattn.active_target(2) in targets
    ctx = cpuattn.Context(threads=2)
    assert ctx.threads == 2
    ctx.max_target = "sse4"
    assert ctx.max_target == "sse4" and ctx.active_target in ("sse4", "scalar")
    assert cpuattn.active_target(context=ctx) == ctx.active_target
    with pytest.raises(ValueError, match="^cpuattn: "):
        ctx.max_target = "avx9000"
    rng = np.random.default_rng(15)
    q, k, v = rand(rng, 1, 2, 33, 24), rand(rng, 1, 2, 40, 24), rand(rng, 1, 2, 40, 24)
    ref = np_attention(q, k, v)[0]
    for t in targets:
        ctx.max_target = t
        np.testing.assert_allclose(cpuattn.attention(q, k, v, context=ctx), ref, atol=tol(40))
    ctx.simd = "xsimd"
    assert ctx.simd == "xsimd"
    np.testing.assert_allclose(cpuattn.attention(q, k, v, context=ctx), ref, atol=tol(40))


# ---------------------------------------------------------------------------------------------
# Attention variants (docs/api.md, "Attention variants") against the NumPy float64 semantics.


@pytest.mark.parametrize("fn", ["attention", "reference_attention"])
@pytest.mark.parametrize(
    "kw",
    [
        dict(window_size=(5, 0)),
        dict(window_size=(-1, 3), is_causal=False),
        dict(softcap=2.0),
        dict(alibi=True),
        dict(alibi_slopes=[0.1, 0.2, 0.3, 0.45]),
        dict(sinks=[0.5, 1.0, -np.inf, 2.0]),
        dict(window_size=(7, -1), softcap=3.0, alibi=True, sinks=[1.0, 0.0, 2.0, -1.0],
             is_causal="bottom_right"),
    ],
)
def test_variants_match_numpy(fn, kw):
    rng = np.random.default_rng(21)
    q, k, v = rand(rng, 2, 4, 9, 16), rand(rng, 2, 2, 30, 16), rand(rng, 2, 2, 30, 8)
    kw = dict(kw)
    causal = kw.get("is_causal", False)
    ref_kw = dict(window_size=kw.get("window_size"), softcap=kw.get("softcap", 0.0),
                  sinks=kw.get("sinks"), alibi_slopes=kw.get("alibi_slopes"))
    if kw.get("alibi"):
        # Press et al.'s slopes for 4 heads: 2^-2, 2^-4, 2^-6, 2^-8.
        ref_kw["alibi_slopes"] = [2.0 ** (-2 * (h + 1)) for h in range(4)]
    for name in ("alibi_slopes", "sinks"):
        if kw.get(name) is not None:
            kw[name] = np.asarray(kw[name], np.float32)
    want, want_lse = np_attention(q, k, v, causal="bottom_right" if causal else None, **ref_kw)
    out, lse = getattr(cpuattn, fn)(q, k, v, return_lse=True, **kw)
    np.testing.assert_allclose(out, want, atol=tol(30, 8.0), rtol=0)
    np.testing.assert_allclose(lse, want_lse, atol=tol(30, 8.0), rtol=1e-6)


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(window_size=(-2, 0)), r"window_left"),
        (dict(window_size=(1, 2, 3)), r"window_size"),
        (dict(softcap=-1.0), r"softcap"),
        (dict(alibi_slopes=np.ones(3, np.float32)), r"alibi_slopes"),
        (dict(sinks=np.array([0, 1, np.nan, 2], np.float32)), r"sinks\[2\]"),
        (dict(sinks=np.arange(4)), r"sinks"),
    ],
)
def test_variant_errors(kw, pattern):
    rng = np.random.default_rng(22)
    q, k, v = _qkv(rng)
    out = np.full((2, 4, 5, 6), 42.0, np.float32)
    with pytest.raises(ValueError, match=pattern):
        cpuattn.attention(q, k, v, out=out, **kw)
    assert np.all(out == 42.0)


# ---------------------------------------------------------------------------------------------
# Packed variable-length batches against each sequence alone.


@pytest.mark.parametrize("fn", ["attention_varlen", "reference_attention_varlen"])
def test_varlen_matches_each_sequence(fn):
    rng = np.random.default_rng(31)
    lq, lk = [5, 0, 3, 9, 2], [7, 4, 0, 9, 30]
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk).astype(np.int32)
    q = rand(rng, cq[-1], 4, 16)
    k, v = rand(rng, ck[-1], 2, 16), rand(rng, ck[-1], 2, 8)
    kw = dict(is_causal="bottom_right", window_size=(4, -1), softcap=3.0,
              sinks=np.array([0.5, 1.0, -np.inf, 2.0], np.float32))
    out, lse = getattr(cpuattn, fn)(q, k, v, cq, ck, return_lse=True, **kw)
    assert out.shape == (cq[-1], 4, 8) and lse.shape == (4, cq[-1])
    for b in range(len(lq)):
        if lq[b] == 0:
            continue
        qs = q[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None]
        ks = k[ck[b]:ck[b + 1]].transpose(1, 0, 2)[None]
        vs = v[ck[b]:ck[b + 1]].transpose(1, 0, 2)[None]
        got = out[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None]
        if lk[b] == 0:
            assert np.all(got == 0)
            continue
        want, want_lse = np_attention(qs, ks, vs, causal="bottom_right", window_size=(4, -1),
                                      softcap=3.0, sinks=kw["sinks"])
        np.testing.assert_allclose(got, want, atol=tol(lk[b]), rtol=0)
        np.testing.assert_allclose(lse[:, cq[b]:cq[b + 1]], want_lse[0], atol=tol(lk[b]) * 8)


def test_varlen_errors():
    rng = np.random.default_rng(32)
    q, k = rand(rng, 7, 2, 8), rand(rng, 7, 1, 8)
    out = np.full((7, 2, 8), 42.0, np.float32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] = 2"):
        cpuattn.attention_varlen(q, k, k, np.array([0, 3, 2, 7]), np.array([0, 2, 5, 7]), out=out)
    with pytest.raises(ValueError, match=r"rank 3"):
        cpuattn.attention_varlen(q[None], k, k, np.array([0, 7]), np.array([0, 7]))
    assert np.all(out == 42.0)
