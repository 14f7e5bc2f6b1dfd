"""A hostile caller from Python (issue 33): contexts trimmed while calls run, a cache of contexts
that grows without bound, failed calls that must change nothing, interleaved views of one buffer,
arguments of the wrong type or range, and finite extremes. Each failed before its fix.

Run as test_cpuattn.py is (ctest's python_tests runs every file here).
"""
import sys
import threading

import numpy as np
import pytest

import cpuattn
from test_cpuattn import np_attention, rand, tol


def test_trim_while_calls_run_waits_instead_of_freeing_their_scratch():
    # Item 2: trim() frees scratch that running calls use; it now waits for them (and calls that
    # start meanwhile wait for it). Before: SIGSEGV, "double free" or wrong results.
    ctx = cpuattn.Context(2)
    q = np.random.default_rng(0).standard_normal((1, 4, 256, 64)).astype(np.float32)
    ref = cpuattn.attention(q, q, q, context=ctx)
    stop = False
    trims = 0

    def trimmer():
        nonlocal trims
        while not stop:
            ctx.trim()
            assert ctx.retained_scratch_bytes >= 0
            trims += 1

    t = threading.Thread(target=trimmer)
    t.start()
    try:
        bad = sum(not np.array_equal(cpuattn.attention(q, q, q, context=ctx), ref)
                  for _ in range(300))
    finally:
        stop = True
        t.join()
    assert bad == 0 and trims > 0


def test_thread_count_contexts_are_bounded_and_releasable():
    # Item 7: one cached context per distinct threads=N grew forever (1,000 values: +335 MiB).
    q = rand(np.random.default_rng(1), 1, 2, 8, 16)
    cpuattn.release_thread_contexts()
    for n in range(1, 200):
        cpuattn.attention(q, q, q, threads=n)
    import os
    assert cpuattn.release_thread_contexts() <= (os.cpu_count() or 1) + 1
    assert cpuattn.release_thread_contexts() == 0
    with pytest.raises(cpuattn.Error, match=r"threads must be >= 0"):
        cpuattn.attention(q, q, q, threads=-1)


def test_failed_decode_on_a_full_growable_cache_changes_nothing():
    # Item 8: the cache doubled its capacity before the checks ran.
    W = np.full((8, 8), 0.05, np.float32)
    m = cpuattn.MultiHeadAttention(8, 2, W, W, W, W)
    for dtype in ("f32", "i8"):
        cache = m.make_cache(1, 2, growable=True, dtype=dtype)
        x = np.ones((1, 2, 8), np.float32)
        m.decode(x, cache)
        keys = cache.keys()
        with pytest.raises(cpuattn.Error):
            m.decode(x[:, :1], cache, key_lengths=[99])
        assert (len(cache), cache.capacity) == (2, 2)
        np.testing.assert_array_equal(cache.keys(), keys)


def test_interleaved_views_of_one_buffer_are_accepted():
    # Item 11: q, k, v and out as disjoint views of one [B, L, 4, H, D] buffer were rejected as
    # overlapping (bounding boxes were compared).
    rng = np.random.default_rng(2)
    buf = rng.standard_normal((2, 9, 4, 3, 8)).astype(np.float32)
    q, k, v, out = (buf[:, :, i].transpose(0, 2, 1, 3) for i in range(4))
    assert not any(np.shares_memory(a, b) for a in (q, k, v) for b in (out,))
    want, _ = np_attention(q, k, v)
    res = cpuattn.attention(q, k, v, out=out)
    assert np.shares_memory(res, buf)
    np.testing.assert_allclose(buf[:, :, 3].transpose(0, 2, 1, 3), want, atol=tol(9), rtol=0)
    # A true overlap is still an error: out over k's last head.
    with pytest.raises(cpuattn.Error, match=r"out overlaps K"):
        cpuattn.attention(q, k, v, out=buf[:, :, 1].transpose(0, 2, 1, 3))


def test_arguments_of_the_wrong_type_or_range_name_the_argument():
    # Item 12.
    rng = np.random.default_rng(3)
    q = rand(rng, 2, 2, 5, 8)
    with pytest.raises(cpuattn.Error, match=r"window_size\[0\] must be an integer, got 1.5"):
        cpuattn.attention(q, q, q, window_size=(1.5, 2))
    with pytest.raises(cpuattn.Error, match=r"window_size must be \(left, right\)"):
        cpuattn.attention(q, q, q, window_size=3)
    with pytest.raises(cpuattn.Error, match=r"window_size\[1\] = .* is outside int64"):
        cpuattn.attention(q, q, q, window_size=(1, 2 ** 70))
    want = cpuattn.attention(q, q, q, key_lengths=np.array([3, 5], np.int64))
    for dt in (np.int16, np.uint32, np.uint8, np.uint64):
        got = cpuattn.attention(q, q, q, key_lengths=np.array([3, 5], dt))
        np.testing.assert_array_equal(got, want)
    with pytest.raises(cpuattn.Error, match=r"key_lengths has dtype float32; expected integers"):
        cpuattn.attention(q, q, q, key_lengths=np.array([3, 5], np.float32))
    packed = rand(rng, 7, 2, 8)
    with pytest.raises(cpuattn.Error, match=r"cu_seqlens_q holds 18446744073709551615, past int64"):
        cpuattn.attention_varlen(packed, packed, packed, np.array([0, 2 ** 64 - 1], np.uint64),
                                 np.array([0, 7]))
    with pytest.raises(cpuattn.Error,
                       match=r"q and k must have the same head dimension D \(q \[7,2,8\], k \[7,1,6\]"):
        cpuattn.attention_varlen(packed, rand(rng, 7, 1, 6), rand(rng, 7, 1, 6), np.array([0, 7]),
                                 np.array([0, 7]))


def test_window_bounds_up_to_int64_max_are_no_bound():
    # Item 3: (-1, sys.maxsize) gave an all-zero output (signed overflow).
    q = rand(np.random.default_rng(4), 1, 2, 6, 8)
    want = cpuattn.attention(q, q, q)
    for w in ((-1, sys.maxsize), (sys.maxsize, sys.maxsize), (sys.maxsize, -1)):
        np.testing.assert_array_equal(cpuattn.attention(q, q, q, window_size=w), want)


def test_finite_extremes_give_finite_results_or_errors():
    # Item 5: float32's lowest as padding (Hugging Face) gives the mean of V for a padded row, as
    # PyTorch's SDPA does; +3e38 in a mask no NaN; huge sinks and slopes are errors.
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 10, 8), rand(rng, 1, 2, 10, 8)
    pad = np.full((1, 1, 1, 10), np.finfo(np.float32).min, np.float32)
    out = cpuattn.attention(q, k, v, attn_mask=pad)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=2, keepdims=True), out.shape),
                               atol=1e-6)
    big = np.zeros((1, 1, 1, 10), np.float32)
    big[..., 4] = 3e38
    out = cpuattn.attention(q, k, v, attn_mask=big)
    np.testing.assert_allclose(out, np.broadcast_to(v[:, :, 4:5], out.shape), atol=1e-6)
    for kw in (dict(sinks=np.array([3e38, 0], np.float32)),
               dict(alibi_slopes=np.array([3e38, 0], np.float32))):
        with pytest.raises(cpuattn.Error, match=r"is outside"):
            cpuattn.attention(q, k, v, **kw)


def test_concurrent_appends_to_one_cache_are_serialized():
    # The thread contract: a KvCache's methods take its lock, so appends from several threads
    # are serialized (every token lands once) instead of racing.
    cache = cpuattn.KvCache(1, 2, 8, capacity=1, growable=True)
    k = np.ones((1, 2, 3, 8), np.float32)

    def appender():
        for _ in range(50):
            cache.append(k, k)

    threads = [threading.Thread(target=appender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 4 * 50 * 3
    np.testing.assert_array_equal(cache.keys(), np.ones((1, 2, 600, 8), np.float32))
