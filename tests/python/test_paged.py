"""Paged KV caches from Python (lib/python/paged.cpp): PagedKvCache, attention_paged and
reference_attention_paged against contiguous attention and the float64 NumPy semantics, with
shared prefixes, reduced-precision pools, per-sequence ALiBi slopes, and the errors.

Run as test_cpuattn.py is (ctest's python_tests runs both).
"""
import numpy as np
import pytest

import cpuattn
from test_cpuattn import np_attention, rand, tol

H, HKV, D, DV, P = 4, 2, 16, 8, 16


def gathered(cache, seq, pool):
    """seq's tokens of a pool ([num_pages, Hkv, P, d]) as a contiguous [1, Hkv, len, d] copy."""
    n = cache.length(seq)
    rows = [pool[cache.pages(seq)[j // P], :, j % P] for j in range(n)]
    return np.stack(rows, axis=1)[None]


def filled_cache(rng, lens, dtype="f32", num_pages=64):
    cache = cpuattn.PagedKvCache(num_pages, P, HKV, D, DV, dtype=dtype)
    seqs, ks, vs = [], [], []
    for n in lens:
        s = cache.add_sequence()
        k, v = rand(rng, HKV, n, D), rand(rng, HKV, n, DV)
        cache.append(s, k, v)
        seqs.append(s)
        ks.append(k)
        vs.append(v)
    return cache, seqs, ks, vs


def test_decode_loop_matches_contiguous_attention_and_numpy():
    # The loop of docs/api.md ("Python"): append each new token's K/V, then attend in place.
    rng = np.random.default_rng(1)
    cache, seqs, ks, vs = filled_cache(rng, [5, 40, 1])
    for step in range(20):
        for i, s in enumerate(seqs):
            k, v = rand(rng, HKV, 1, D), rand(rng, HKV, 1, DV)
            cache.append(s, k, v)
            ks[i] = np.concatenate([ks[i], k], axis=1)
            vs[i] = np.concatenate([vs[i], v], axis=1)
        q = rand(rng, len(seqs), H, 1, D)
        out, lse = cpuattn.attention_paged(q, **cache.batch(seqs), is_causal="bottom_right",
                                           return_lse=True)
        assert out.shape == (3, H, 1, DV) and out.dtype == np.float32
        for b, s in enumerate(seqs):
            want, want_lse = np_attention(q[b:b + 1], ks[b][None], vs[b][None],
                                          causal="bottom_right")
            np.testing.assert_allclose(out[b:b + 1], want, atol=tol(ks[b].shape[1]), rtol=0)
            np.testing.assert_allclose(lse[b:b + 1], want_lse, atol=8 * tol(ks[b].shape[1]))
            dense = cpuattn.attention(q[b:b + 1], gathered(cache, s, cache.k_pages),
                                      gathered(cache, s, cache.v_pages))
            np.testing.assert_allclose(out[b:b + 1], dense, atol=tol(ks[b].shape[1]), rtol=0)
    ref = cpuattn.reference_attention_paged(q, **cache.batch(seqs), is_causal="bottom_right")
    assert ref.dtype == np.float64
    np.testing.assert_allclose(out, ref, atol=tol(100), rtol=0)


def test_shared_prefix_and_copy_on_write():
    rng = np.random.default_rng(2)
    cache, (a,), (ka,), (va,) = filled_cache(rng, [40])
    free = cache.free_pages
    b = cache.fork(a, 36)  # shares pages 0..2, the third partly used: copied on b's first write
    assert cache.pages(b) == cache.pages(a)[:3] and cache.free_pages == free
    kb, vb = rand(rng, HKV, 4, D), rand(rng, HKV, 4, DV)
    cache.append(b, kb, vb)
    assert cache.pages(b)[:2] == cache.pages(a)[:2] and cache.pages(b)[2] != cache.pages(a)[2]
    q = rand(rng, 2, H, 3, D)
    out = cpuattn.attention_paged(q, **cache.batch([a, b]), is_causal="bottom_right",
                                  window_size=(20, 0), softcap=5.0)
    kb_all = np.concatenate([ka[:, :36], kb], axis=1)
    vb_all = np.concatenate([va[:, :36], vb], axis=1)
    for i, (k, v) in enumerate([(ka, va), (kb_all, vb_all)]):
        want, _ = np_attention(q[i:i + 1], k[None], v[None], causal="bottom_right",
                               window_size=(20, 0), softcap=5.0)
        np.testing.assert_allclose(out[i:i + 1], want, atol=tol(40), rtol=0)
    cache.free(b)
    cache.truncate(a, 10)
    assert cache.length(a) == 10 and cache.free_pages == 64 - 1


@pytest.mark.parametrize("dtype", ["bf16", "f16", "i8"])
def test_reduced_precision_pools(dtype):
    rng = np.random.default_rng(3)
    cache, seqs, _, _ = filled_cache(rng, [33, 70], dtype=dtype)
    kw = cache.batch(seqs)
    assert ("k_scales" in kw) == (dtype == "i8")
    q = rand(rng, 2, H, 2, D)
    out = cpuattn.attention_paged(q, **kw, is_causal="bottom_right")
    ref = cpuattn.reference_attention_paged(q, **kw, is_causal="bottom_right")
    # The reference reads the same stored values; the fast path's error on them is f32's, or the
    # native bf16 path's 2^-8 where the CPU has it.
    np.testing.assert_allclose(out, ref, atol=2 ** -8 + tol(70), rtol=0)


def test_bf16_queries_and_pool():
    rng = np.random.default_rng(4)
    cache, seqs, _, _ = filled_cache(rng, [50], dtype="bf16")
    q = cpuattn.to_bf16(rand(rng, 1, H, 4, D))
    out = cpuattn.attention_paged(q, **cache.batch(seqs), bf16=True, is_causal="bottom_right")
    assert out.dtype == np.uint16
    ref = cpuattn.reference_attention_paged(q, **cache.batch(seqs), bf16=True,
                                            is_causal="bottom_right")
    np.testing.assert_allclose(cpuattn.from_bf16(out), ref, atol=2 ** -7, rtol=0)


def test_pool_is_a_zero_copy_read_only_view():
    rng = np.random.default_rng(5)
    cache, (s,), _, _ = filled_cache(rng, [3])
    view = cache.k_pages
    assert view.shape == (64, HKV, P, D) and not view.flags.writeable
    assert np.shares_memory(view, cache.k_pages)
    k = rand(rng, HKV, 1, D)
    cache.append(s, k, rand(rng, HKV, 1, DV))
    np.testing.assert_array_equal(view[cache.pages(s)[0], :, 3], k[:, 0])
    with pytest.raises(ValueError):
        view[0, 0, 0, 0] = 1.0
    del cache  # the view keeps the pool alive
    assert np.isfinite(view[0, 0, 0, 0])


def test_alibi_slopes_per_sequence():
    rng = np.random.default_rng(6)
    cache, seqs, ks, vs = filled_cache(rng, [20, 9])
    q = rand(rng, 2, H, 1, D)
    slopes = rng.uniform(0.05, 0.5, (2, H)).astype(np.float32)
    out = cpuattn.attention_paged(q, **cache.batch(seqs), alibi_slopes=slopes)
    for b in range(2):
        want, _ = np_attention(q[b:b + 1], ks[b][None], vs[b][None], alibi_slopes=slopes[b])
        np.testing.assert_allclose(out[b:b + 1], want, atol=tol(20, 10), rtol=0)
    # [B, H] in dense attention and packed batches too.
    k, v = rand(rng, 2, HKV, 9, D), rand(rng, 2, HKV, 9, DV)
    dense = cpuattn.attention(q, k, v, alibi_slopes=slopes)
    for b in range(2):
        want, _ = np_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], alibi_slopes=slopes[b])
        np.testing.assert_allclose(dense[b:b + 1], want, atol=tol(9, 10), rtol=0)
    packed = cpuattn.attention_varlen(q[:, :, 0], k.transpose(0, 2, 1, 3).reshape(18, HKV, D),
                                      v.transpose(0, 2, 1, 3).reshape(18, HKV, DV),
                                      np.array([0, 1, 2]), np.array([0, 9, 18]),
                                      alibi_slopes=slopes)
    np.testing.assert_allclose(packed, dense[:, :, 0], atol=tol(9, 10), rtol=0)
    with pytest.raises(cpuattn.Error, match=r"expected \[4\] or \[2, 4\]"):
        cpuattn.attention(q, k, v, alibi_slopes=np.ones((3, H), np.float32))


def test_errors_name_the_argument_and_write_nothing():
    rng = np.random.default_rng(7)
    cache, seqs, _, _ = filled_cache(rng, [20, 9])
    q = rand(rng, 2, H, 1, D)
    out = np.full((2, H, 1, DV), 42.0, np.float32)
    kw = cache.batch(seqs)
    bad = dict(kw, block_table=kw["block_table"].copy())
    bad["block_table"][1, 0] = 64
    with pytest.raises(cpuattn.Error, match=r"block_table\[1, 0\] = 64 is outside \[0, num_pages\)"):
        cpuattn.attention_paged(q, **bad, out=out)
    bad["block_table"] = bad["block_table"].astype(np.int64)
    bad["block_table"][1, 0] = 2 ** 40
    with pytest.raises(cpuattn.Error, match=r"block_table holds 1099511627776, outside int32"):
        cpuattn.attention_paged(q, **bad, out=out)
    with pytest.raises(cpuattn.Error, match=r"seq_lens\[0\] = 999"):
        cpuattn.attention_paged(q, **dict(kw, seq_lens=np.array([999, 9])), out=out)
    with pytest.raises(cpuattn.Error, match=r"block_table has shape \[2,2\] but Q has B=3"):
        cpuattn.attention_paged(rand(rng, 3, H, 1, D), **kw)
    with pytest.raises(cpuattn.Error, match=r"q has shape \[2,4,16\]"):
        cpuattn.attention_paged(q[:, :, 0], **kw)
    with pytest.raises(cpuattn.Error, match=r"v_pages"):
        cpuattn.attention_paged(q, **dict(kw, v_pages=kw["v_pages"][:, :, :8]), out=out)
    assert np.all(out == 42.0)
    # A failed append changes nothing: too few pages, or a non-finite value in an int8 cache.
    before = (cache.free_pages, cache.length(seqs[0]))
    with pytest.raises(cpuattn.Error):
        cache.append(seqs[0], rand(rng, HKV, 64 * P, D), rand(rng, HKV, 64 * P, DV))
    assert (cache.free_pages, cache.length(seqs[0])) == before
    i8 = cpuattn.PagedKvCache(4, P, HKV, D, DV, dtype="i8")
    s = i8.add_sequence()
    k = rand(rng, HKV, 2, D)
    k[1, 1, 3] = np.nan
    with pytest.raises(cpuattn.Error, match=r"k\[1,1,3\] is nan, which an int8 cache cannot hold"):
        i8.append(s, k, rand(rng, HKV, 2, DV))
    assert i8.length(s) == 0 and i8.free_pages == 4


# Every K/V dtype of the library's list (cpuattn.kv_dtypes()), read from the list: a scaled one
# with per-token scales and with static per-head and per-tensor ones. The fast path on the pools
# against the float64 reference on the same stored values; the stored K/V within the type's
# resolution of the data; the contiguous KvCache with the same scales and a decode step on it.
def scale_modes(d):
    if not d["scaled"]:
        return [None]
    return ["per_token", "per_head", "per_tensor"]


@pytest.mark.parametrize("d, mode", [(d, m) for d in cpuattn.kv_dtypes() for m in scale_modes(d)],
                         ids=lambda x: x["name"] if isinstance(x, dict) else str(x))
def test_every_kv_dtype_from_the_list(d, mode):
    rng = np.random.default_rng(9)
    k_scale = {"per_head": [0.02, 0.03], "per_tensor": 0.025}.get(mode)
    v_scale = {"per_head": [0.03, 0.02], "per_tensor": 0.025}.get(mode)
    cache = cpuattn.PagedKvCache(64, P, HKV, D, DV, dtype=d["name"], k_scale=k_scale,
                                 v_scale=v_scale)
    seqs = [cache.add_sequence() for _ in range(2)]
    for s, n in zip(seqs, [45, 70]):
        cache.append(s, rand(rng, HKV, n, D), rand(rng, HKV, n, DV))
    kw = cache.batch(seqs)
    assert kw["kv_dtype"] == d["name"]
    assert kw["k_pages"].dtype.itemsize == d["bytes"]
    assert ("k_scales" in kw) == d["scaled"]
    if mode in ("per_head", "per_tensor"):
        assert kw["k_scales"].shape == (HKV,)
    q = rand(rng, 2, H, 3, D)
    out = cpuattn.attention_paged(q, **kw, is_causal="bottom_right")
    ref = cpuattn.reference_attention_paged(q, **kw, is_causal="bottom_right")
    # V is standard normal (|v| < 5): the fast path's f32 error, and the native units' rounding of
    # P (2^-8 of max |v|) where the CPU has them.
    np.testing.assert_allclose(out, ref, atol=5 * (2 ** -8 + tol(70)), rtol=0)
    c = cpuattn.KvCache(1, HKV, D, DV, capacity=8, dtype=d["name"], k_scale=k_scale,
                        v_scale=v_scale)
    k = rand(rng, 1, HKV, 5, D)
    c.append(k, rand(rng, 1, HKV, 5, DV))
    assert c.keys().dtype.itemsize == d["bytes"]
    assert (c.key_scales() is None) == (not d["scaled"])
    if mode in ("per_head", "per_tensor"):
        assert c.key_scales().shape == (HKV,)


def test_bad_kv_dtype_and_scales_name_the_argument():
    with pytest.raises(cpuattn.Error, match="dtype must be one of"):
        cpuattn.PagedKvCache(8, P, HKV, D, DV, dtype="float7")
    with pytest.raises(cpuattn.Error, match="scales are for scaled dtypes"):
        cpuattn.KvCache(1, HKV, D, DV, capacity=8, dtype="f32", k_scale=1.0, v_scale=1.0)
    with pytest.raises(cpuattn.Error, match="finite and > 0"):
        cpuattn.PagedKvCache(8, P, HKV, D, DV, dtype="int8", k_scale=[1.0, -1.0], v_scale=1.0)
    cache, seqs, _, _ = filled_cache(np.random.default_rng(4), [20], dtype="int8")
    kw = cache.batch(seqs)
    kw["kv_dtype"] = "f16"
    with pytest.raises(cpuattn.Error, match="kv_dtype"):
        cpuattn.attention_paged(rand(np.random.default_rng(5), 1, H, 1, D), **kw)
