"""KvCache and MultiHeadAttention from Python: forward against NumPy, decode against forward."""
import numpy as np
import pytest

import cpuattn
from test_cpuattn import np_attention


def make_layer(rng, d_model=48, heads=6, kv_heads=2, head_dim=8, value_dim=12, bias=True):
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
    b = lambda n: rng.standard_normal(n).astype(np.float32) * 0.1 if bias else None
    p = dict(wq=w(d_model, heads * head_dim), wk=w(d_model, kv_heads * head_dim),
             wv=w(d_model, kv_heads * value_dim), wo=w(heads * value_dim, d_model),
             bq=b(heads * head_dim), bk=b(kv_heads * head_dim), bv=b(kv_heads * value_dim),
             bo=b(d_model))
    layer = cpuattn.MultiHeadAttention(d_model, heads, p["wq"], p["wk"], p["wv"], p["wo"],
                                       kv_heads=kv_heads, head_dim=head_dim,
                                       value_dim=value_dim, bq=p["bq"], bk=p["bk"], bv=p["bv"],
                                       bo=p["bo"])
    return layer, p


def np_mha(p, x, heads, kv_heads, head_dim, value_dim, causal=None):
    x = x.astype(np.float64)
    B, L, _ = x.shape
    lin = lambda w, b: x @ w + (0 if b is None else b)
    q = lin(p["wq"], p["bq"]).reshape(B, L, heads, head_dim).transpose(0, 2, 1, 3)
    k = lin(p["wk"], p["bk"]).reshape(B, L, kv_heads, head_dim).transpose(0, 2, 1, 3)
    v = lin(p["wv"], p["bv"]).reshape(B, L, kv_heads, value_dim).transpose(0, 2, 1, 3)
    o = np_attention(q, k, v, causal=causal)[0].transpose(0, 2, 1, 3).reshape(B, L, -1)
    return o @ p["wo"] + (0 if p["bo"] is None else p["bo"])


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_numpy(causal):
    rng = np.random.default_rng(20)
    layer, p = make_layer(rng)
    assert (layer.d_model, layer.heads, layer.kv_heads, layer.head_dim, layer.value_dim) == (
        48, 6, 2, 8, 12)
    x = rng.standard_normal((2, 13, 48)).astype(np.float32)
    out = layer.forward(x, is_causal=causal)
    assert out.shape == (2, 13, 48) and out.dtype == np.float32
    ref = np_mha(p, x, 6, 2, 8, 12, causal="top_left" if causal else None)
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)
    # out= in place; weights were copied by the layer, so changing them changes nothing.
    p["wq"][:] = 0
    buf = np.empty_like(x)
    assert layer.forward(x, is_causal=causal, out=buf) is buf
    np.testing.assert_array_equal(buf, out)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "i8"])
def test_decode_matches_causal_forward(dtype):
    rng = np.random.default_rng(21)
    layer, _ = make_layer(rng)
    B, L = 2, 11
    x = rng.standard_normal((B, L, 48)).astype(np.float32)
    full = layer.forward(x, is_causal=True)
    cache = layer.make_cache(B, capacity=4, growable=True, dtype=dtype)
    assert cache.length == 0 and cache.kv_heads == 2 and cache.head_dim == 8
    assert cache.value_dim == 12
    # Prefill 5 tokens at once, then one token per step.
    steps = [layer.decode(x[:, :5], cache)]
    steps += [layer.decode(x[:, i:i + 1], cache) for i in range(5, L)]
    assert cache.length == L and cache.capacity >= L
    got = np.concatenate(steps, axis=1)
    atol = {"f32": 1e-5, "bf16": 3e-2, "f16": 5e-3, "i8": 6e-2}[dtype]
    np.testing.assert_allclose(got, full, atol=atol)
    # The last row: the new token attends to every cached token.
    np.testing.assert_allclose(steps[-1][:, 0], full[:, -1], atol=atol)
    # Roll back and redo the last token: same answer.
    cache.truncate(L - 1)
    assert cache.length == L - 1
    np.testing.assert_array_equal(layer.decode(x[:, -1:], cache), steps[-1])
    cache.clear()
    assert cache.length == 0


def test_kv_cache_append_and_attention():
    rng = np.random.default_rng(22)
    B, Hkv, D, Dv = 1, 2, 16, 8
    cache = cpuattn.KvCache(B, Hkv, D, Dv, capacity=8)
    assert not cache.growable and cache.capacity == 8 and cache.dtype == "float32"
    k = rng.standard_normal((B, Hkv, 5, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, 5, Dv)).astype(np.float32)
    cache.append(k, v)
    assert cache.length == 5 and len(cache) == 5
    np.testing.assert_array_equal(cache.keys(), k)
    np.testing.assert_array_equal(cache.values(), v)
    # A fixed cache that would overflow raises and keeps its tokens.
    k2 = rng.standard_normal((B, Hkv, 4, D)).astype(np.float32)
    v2 = rng.standard_normal((B, Hkv, 4, Dv)).astype(np.float32)
    with pytest.raises(ValueError, match="^cpuattn: "):
        cache.append(k2, v2)
    assert cache.length == 5
    # Attention over the cached keys (bottom-right causal for the new queries).
    q = rng.standard_normal((B, 4, 2, D)).astype(np.float32)
    out = cpuattn.attention(q, cache.keys(), cache.values(), is_causal="bottom_right")
    np.testing.assert_allclose(out, np_attention(q, k, v, causal="bottom_right")[0], atol=1e-5)
    with pytest.raises(ValueError, match="^cpuattn: dtype"):
        cpuattn.KvCache(1, 1, 4, capacity=4, dtype="f64")


def test_mha_errors():
    rng = np.random.default_rng(23)
    layer, p = make_layer(rng)
    with pytest.raises(ValueError, match="^cpuattn: "):
        layer.forward(rng.standard_normal((2, 3, 47)).astype(np.float32))
    with pytest.raises(ValueError, match="^cpuattn: .*wq"):
        cpuattn.MultiHeadAttention(48, 6, p["wq"][:, :-1], p["wk"], p["wv"], p["wo"],
                                   kv_heads=2, head_dim=8, value_dim=12)


def test_kv_cache_views_share_the_cache_memory():
    rng = np.random.default_rng(31)
    B, Hkv, D, Dv = 2, 2, 16, 8
    for dtype in ("float32", "bf16", "int8"):
        cache = cpuattn.KvCache(B, Hkv, D, Dv, capacity=12, dtype=dtype)
        k = rng.standard_normal((B, Hkv, 5, D)).astype(np.float32)
        v = rng.standard_normal((B, Hkv, 5, Dv)).astype(np.float32)
        cache.append(k, v)
        keys, values = cache.keys(copy=False), cache.values(copy=False)
        # The same bits as the copies, read in place: strided over the capacity, read-only.
        np.testing.assert_array_equal(keys, cache.keys())
        np.testing.assert_array_equal(values, cache.values())
        assert keys.shape == (B, Hkv, 5, D) and not keys.flags.writeable
        assert keys.strides[1] == 12 * D * keys.itemsize
        assert not np.shares_memory(cache.keys(), keys)
        if dtype == "int8":
            np.testing.assert_array_equal(cache.key_scales(copy=False), cache.key_scales())
        else:
            assert cache.key_scales(copy=False) is None
        # A view sees what later happens to its tokens, and outlives the name of its cache.
        before = keys.copy()
        cache.truncate(3)
        cache.append(k[:, :, :2] + 1, v[:, :, :2])
        np.testing.assert_array_equal(keys[:, :, :3], before[:, :, :3])
        np.testing.assert_array_equal(keys[:, :, 3:], cache.keys()[:, :, 3:])
        assert not np.array_equal(keys[:, :, 3:], before[:, :, 3:])
        del cache
        assert np.isfinite(keys.astype(np.float32)).all()
    grow = cpuattn.KvCache(1, 1, 4, capacity=2, growable=True)
    with pytest.raises(ValueError, match="growable cache moves its memory"):
        grow.keys(copy=False)
