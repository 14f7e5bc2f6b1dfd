"""A decoder layer (RoPE and QK-norm inside MultiHeadAttention) against a float64 NumPy reference
of the whole block written from the published formulas: Hugging Face transformers'
modeling_rope_utils (default, linear, Llama 3, YaRN frequencies), `rotate_half` /
`apply_rotary_pos_emb` (GPT-NeoX, Llama; partial rotary as GPT-NeoX and Phi), GPT-J's
`rotate_every_two`, Qwen3's per-head `q_norm` / `k_norm` and OLMo 2's norm over the projection.
"""
import math

import numpy as np
import pytest

import cpuattn
from test_cpuattn import np_attention


def hf_inv_freq(theta, dim, scaling):
    """The inverse frequencies and the attention factor of `dim` rotated dimensions."""
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "ntk":  # the NTK-aware base change (static)
        theta = theta * scaling["factor"] ** (dim / (dim - 2))
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if kind in ("default", "ntk"):
        return inv_freq, 1.0
    factor = scaling["factor"]
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":  # _compute_llama3_parameters
        old_context_len = scaling["original_max_position_embeddings"]
        low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(is_medium, smoothed, inv_freq_llama), 1.0
    assert kind == "yarn"  # _compute_yarn_parameters
    original = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)
    attention_factor = scaling.get("attention_factor") or (
        0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)

    def correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (
        1.0 / pos_freqs) * extrapolation_factor
    return inv, attention_factor


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return np.concatenate((-x2, x1), axis=-1)


def rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return np.stack((-x2, x1), axis=-1).reshape(x.shape)


def apply_rope(x, positions, rope):
    """x [B, H, L, D] at positions [L]: the rotary part (first R dimensions) turned, the rest
    passed through."""
    D = x.shape[-1]
    R = rope.get("rotary_dim") or D
    inv_freq, m = hf_inv_freq(rope.get("theta", 10000.0), R, rope.get("scaling"))
    freqs = np.outer(positions.astype(np.float64), inv_freq)  # [L, R/2]
    if rope.get("style", "half") == "half":
        emb = np.concatenate((freqs, freqs), axis=-1)
        turn = rotate_half
    else:
        emb = np.repeat(freqs, 2, axis=-1)
        turn = rotate_every_two
    cos, sin = np.cos(emb) * m, np.sin(emb) * m
    rot, rest = x[..., :R], x[..., R:]
    return np.concatenate((rot * cos + turn(rot) * sin, rest), axis=-1)


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def np_decoder(p, x, cfg, causal="top_left", positions=None):
    """The block in float64: projections, QK-norm, RoPE, attention, output projection; RoPE at
    positions [B, L] (Hugging Face's position_ids), by default 0 .. L-1."""
    x = x.astype(np.float64)
    B, L, _ = x.shape
    H, Hkv, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = x @ p["wq"] + p["bq"]
    k = x @ p["wk"] + p["bk"]
    v = x @ p["wv"] + p["bv"]
    norm, eps = cfg.get("qk_norm"), cfg.get("qk_norm_eps", 1e-6)
    if norm == "projection":  # OLMo 2: over the whole projection
        q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)
    q = q.reshape(B, L, H, D)
    k = k.reshape(B, L, Hkv, D)
    if norm == "head":  # Qwen3: each head
        q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)
    q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
    v = v.reshape(B, L, Hkv, D).transpose(0, 2, 1, 3)
    if cfg.get("rope") is not None:
        pos = np.broadcast_to(np.arange(L) if positions is None else positions, (B, L))
        q = np.stack([apply_rope(q[b], pos[b], cfg["rope"]) for b in range(B)])
        k = np.stack([apply_rope(k[b], pos[b], cfg["rope"]) for b in range(B)])
    o = np_attention(q, k, v, causal=causal)[0].transpose(0, 2, 1, 3).reshape(B, L, H * D)
    return o @ p["wo"] + p["bo"]


def make(rng, cfg, d_model=64):
    H, Hkv, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
    b = lambda n: (rng.standard_normal(n) * 0.1).astype(np.float32)
    p = dict(wq=w(d_model, H * D), wk=w(d_model, Hkv * D), wv=w(d_model, Hkv * D),
             wo=w(H * D, d_model), bq=b(H * D), bk=b(Hkv * D), bv=b(Hkv * D), bo=b(d_model))
    norm = cfg.get("qk_norm")
    if norm is not None:
        nq, nk = (D, D) if norm == "head" else (H * D, Hkv * D)
        p["q_norm"] = rng.uniform(0.5, 1.5, nq).astype(np.float32)
        p["k_norm"] = rng.uniform(0.5, 1.5, nk).astype(np.float32)
    layer = cpuattn.MultiHeadAttention(
        d_model, H, p["wq"], p["wk"], p["wv"], p["wo"], kv_heads=Hkv, head_dim=D,
        bq=p["bq"], bk=p["bk"], bv=p["bv"], bo=p["bo"], rope=cfg.get("rope"), qk_norm=norm,
        q_norm=p.get("q_norm"), k_norm=p.get("k_norm"),
        qk_norm_eps=cfg.get("qk_norm_eps", 1e-6))
    return layer, p


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
CASES = {
    "neox": dict(rope={"theta": 10000.0}),
    "gptj": dict(rope={"theta": 10000.0, "style": "interleaved"}),
    "partial": dict(rope={"theta": 10000.0, "rotary_dim": 8}),
    "linear": dict(rope={"theta": 10000.0, "scaling": {"rope_type": "linear", "factor": 4.0}}),
    "ntk": dict(rope={"theta": 10000.0, "scaling": {"rope_type": "ntk", "factor": 4.0}}),
    "llama3": dict(rope={"theta": 500000.0, "scaling": LLAMA3}),
    "yarn": dict(rope={"theta": 10000.0, "scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}),
    "qwen3": dict(rope={"theta": 1000000.0}, qk_norm="head", qk_norm_eps=1e-6),
    "olmo2": dict(rope={"theta": 500000.0}, qk_norm="projection", qk_norm_eps=1e-6),
    "qk_norm_only": dict(qk_norm="head", qk_norm_eps=1e-5),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_the_published_formulas(name, causal):
    rng = np.random.default_rng(len(name) + 7 * causal)
    cfg = dict(heads=4, kv_heads=2, head_dim=16, **CASES[name])
    layer, p = make(rng, cfg)
    x = rng.standard_normal((2, 37, 64)).astype(np.float32)
    out = layer.forward(x, is_causal=causal)
    ref = np_decoder(p, x, cfg, causal="top_left" if causal else None)
    np.testing.assert_allclose(out, ref, atol=2e-4, rtol=1e-4, err_msg=name)
    if cfg.get("rope") is not None:  # and the reference can tell: without rotation it differs
        plain = np_decoder(p, x, dict(cfg, rope=None), causal="top_left" if causal else None)
        assert np.max(np.abs(plain - ref)) > 1e-2


def test_gptj_and_neox_agree_on_permuted_weights():
    rng = np.random.default_rng(5)
    cfg = dict(heads=4, kv_heads=2, head_dim=16, rope={"theta": 10000.0})
    neox, p = make(rng, cfg)
    # Interleaved dimension 2j is half-split j, 2j + 1 is j + D/2.
    perm = np.arange(16).reshape(2, 8).T.reshape(-1)
    def permuted(w, heads):
        return np.ascontiguousarray(w.reshape(w.shape[:-1] + (heads, 16))[..., perm].reshape(w.shape))
    gptj = cpuattn.MultiHeadAttention(
        64, 4, permuted(p["wq"], 4), permuted(p["wk"], 2), p["wv"], p["wo"], kv_heads=2,
        head_dim=16, bq=permuted(p["bq"], 4), bk=permuted(p["bk"], 2), bv=p["bv"], bo=p["bo"],
        rope={"theta": 10000.0, "style": "interleaved"})
    x = rng.standard_normal((1, 19, 64)).astype(np.float32)
    np.testing.assert_allclose(gptj.forward(x, is_causal=True), neox.forward(x, is_causal=True),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama3", "qwen3", "olmo2"])
def test_decode_matches_causal_forward(name):
    rng = np.random.default_rng(11)
    cfg = dict(heads=4, kv_heads=2, head_dim=16, **CASES[name])
    layer, _ = make(rng, cfg)
    B, L = 2, 9
    x = rng.standard_normal((B, L, 64)).astype(np.float32)
    full = layer.forward(x, is_causal=True)
    cache = layer.make_cache(B, capacity=L)
    got = [layer.decode(x[:, :4], cache)]
    got += [layer.decode(x[:, t:t + 1], cache) for t in range(4, L)]
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["neox", "gptj", "llama3", "yarn", "olmo2"])
def test_explicit_positions_match_the_published_formulas(name):
    rng = np.random.default_rng(21)
    cfg = dict(heads=4, kv_heads=2, head_dim=16, **CASES[name])
    layer, p = make(rng, cfg)
    x = rng.standard_normal((2, 13, 64)).astype(np.float32)
    pos = rng.integers(0, 6000, size=(2, 13))  # left padding, chunks, anything
    out = layer.forward(x, is_causal=True, positions=pos)
    np.testing.assert_allclose(out, np_decoder(p, x, cfg, positions=pos), atol=2e-4, rtol=1e-4)
    # One row for every sequence; 0 .. L-1 given explicitly is the default bit for bit.
    row = rng.integers(0, 100, size=13).astype(np.int32)
    np.testing.assert_array_equal(layer.forward(x, positions=row),
                                  layer.forward(x, positions=np.stack([row, row])))
    np.testing.assert_array_equal(layer.forward(x, positions=np.arange(13)), layer.forward(x))


@pytest.mark.parametrize("name", ["llama3", "qwen3", "qk_norm_only"])
def test_forward_varlen_equals_each_sequence_alone(name):
    rng = np.random.default_rng(22)
    cfg = dict(heads=4, kv_heads=2, head_dim=16, **CASES[name])
    layer, p = make(rng, cfg)
    lens = [5, 0, 12, 1, 7]
    cu = np.concatenate(([0], np.cumsum(lens)))
    x = rng.standard_normal((cu[-1], 64)).astype(np.float32)
    out = layer.forward_varlen(x, cu, is_causal=True)
    assert out.shape == x.shape
    for b, n in enumerate(lens):
        if n:
            ref = np_decoder(p, x[None, cu[b]:cu[b + 1]], cfg)[0]
            np.testing.assert_allclose(out[cu[b]:cu[b + 1]], ref, atol=2e-4, rtol=1e-4)
    if cfg.get("rope") is not None:  # explicit positions: each sequence continues at 100 b
        pos = np.concatenate([100 * b + np.arange(n) for b, n in enumerate(lens)])
        out = layer.forward_varlen(x, cu, is_causal=True, positions=pos)
        for b, n in enumerate(lens):
            if n:
                ref = np_decoder(p, x[None, cu[b]:cu[b + 1]], cfg,
                                 positions=pos[None, cu[b]:cu[b + 1]])[0]
                np.testing.assert_allclose(out[cu[b]:cu[b + 1]], ref, atol=2e-4, rtol=1e-4)


def test_bad_positions_and_offsets_name_them():
    rng = np.random.default_rng(23)
    cfg = dict(heads=4, kv_heads=2, head_dim=16, **CASES["neox"])
    layer, _ = make(rng, cfg)
    plain, _ = make(rng, dict(heads=4, kv_heads=2, head_dim=16))
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    out = np.full_like(x, 7.0)
    with pytest.raises(cpuattn.Error, match="MhaConfig::rope"):
        plain.forward(x, positions=np.arange(3), out=out)
    with pytest.raises(cpuattn.Error, match=r"positions \[3,2\] must be \[2,3\] or \[3\]"):
        layer.forward(x, positions=np.zeros((3, 2), np.int64), out=out)
    with pytest.raises(cpuattn.Error, match=r"positions\[1,0\] = -4"):
        layer.forward(x, positions=np.array([[0, 1, 2], [-4, 1, 2]]), out=out)
    with pytest.raises(cpuattn.Error, match="positions has dtype float"):
        layer.forward(x, positions=np.zeros((2, 3)), out=out)
    with pytest.raises(cpuattn.Error, match=r"cu_seqlens\[2\] = 5"):
        layer.forward_varlen(x.reshape(6, 64), [0, 4, 5], out=out.reshape(6, 64))
    assert np.all(out == 7.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rope=[1]), "rope must be a dict"),
    (dict(rope={"base": 10000.0}), "unknown key 'base'"),
    (dict(rope={"style": "gptj"}), "'half' or 'interleaved'"),
    (dict(rope={"scaling": {"rope_type": "dynamic", "factor": 2.0}}), "'dynamic'"),
    (dict(rope={"scaling": {"rope_type": "yarn", "factor": "4"}}), "must be a number"),
    (dict(rope={"scaling": {"rope_type": "linear", "factor": 0.5}}), "rope.scaling.factor"),
    (dict(rope={"rotary_dim": 7}), "rope.rotary_dim"),
    (dict(qk_norm="layer"), "qk_norm must be"),
    (dict(qk_norm="head"), "q_norm is required"),
])
def test_bad_configurations_name_the_argument(kwargs, message):
    rng = np.random.default_rng(3)
    w = lambda *s: rng.standard_normal(s).astype(np.float32)
    with pytest.raises(cpuattn.Error, match=message):
        cpuattn.MultiHeadAttention(64, 4, w(64, 64), w(64, 64), w(64, 64), w(64, 64), **kwargs)
