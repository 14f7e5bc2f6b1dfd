"""torch tensors through DLPack: bf16/f16/f32 in without copies, torch tensors back, out= written
in place, and errors that name the argument. Skipped (with the reason) when torch is absent.
"""
import math

import numpy as np
import pytest

import cpuattn
from test_cpuattn import np_attention, tol

torch = pytest.importorskip("torch", reason="torch not installed (python3-torch)")

# Outputs rounded to bf16 (8 significant bits) and, on avx512_bf16, P rounded to bf16 before P V:
# each at most 2^-9 relative, on outputs and values of magnitude <= ~4 (N(0, 1) inputs).
BF16_ATOL = 2e-2
F16_ATOL = 2e-3  # 11 significant bits


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def qkv(seed, B=2, H=4, Hkv=2, Lq=13, Lk=37, D=24, Dv=20):
    g = torch.Generator().manual_seed(seed)
    return randn(g, B, H, Lq, D), randn(g, B, Hkv, Lk, D), randn(g, B, Hkv, Lk, Dv)


def ref_of(q, k, v, **kw):
    """float64 NumPy reference of the values the tensors hold (bf16 widened exactly)."""
    return np_attention(*(t.double().numpy() for t in (q, k, v)), **kw)[0]


@pytest.mark.parametrize("dtype,atol", [(torch.float32, None), (torch.bfloat16, BF16_ATOL),
                                        (torch.float16, F16_ATOL)])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_inputs_match_the_reference_and_come_back_as_torch(dtype, atol, causal):
    q, k, v = (t.to(dtype) for t in qkv(1))
    out = cpuattn.attention(q, k, v, is_causal=causal)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == (2, 4, 13, 20)
    want = ref_of(q, k, v, causal="top_left" if causal else None)
    np.testing.assert_allclose(out.double().numpy(), want, rtol=0, atol=atol or tol(37))
    # The double-precision oracle takes them too, and answers in float64 torch.
    ref = cpuattn.reference_attention(q, k, v, is_causal=causal)
    assert isinstance(ref, torch.Tensor) and ref.dtype == torch.float64
    np.testing.assert_allclose(ref.numpy(), want, rtol=0, atol=1e-12)


def test_non_contiguous_views_are_read_through_their_strides():
    g = torch.Generator().manual_seed(2)
    # [B, L, H, D] tensors viewed as [B, H, L, D], bf16 with a sliced (gapped) last-but-one dim.
    q = randn(g, 2, 11, 4, 16).bfloat16().transpose(1, 2)
    kv = randn(g, 2, 29, 2, 40).bfloat16()
    k, v = kv[..., :16].transpose(1, 2), kv[..., 16:40].transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    out = cpuattn.attention(q, k, v)
    np.testing.assert_allclose(out.double().numpy(), ref_of(q, k, v), rtol=0, atol=BF16_ATOL)
    np.testing.assert_array_equal(
        out.float().numpy(),
        cpuattn.attention(q.contiguous(), k.contiguous(), v.contiguous()).float().numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_tensor_is_written_in_place_and_returned(dtype):
    q, k, v = (t.to(dtype) for t in qkv(3))
    want = cpuattn.attention(q, k, v)
    out = torch.full((2, 4, 13, 20), float("nan"), dtype=dtype)
    got = cpuattn.attention(q, k, v, out=out)
    assert got is out
    assert torch.equal(out, want)
    # A strided out: [B, L, H, Dv] storage written through its [B, H, L, Dv] view; the gap
    # columns keep their poison.
    store = torch.full((2, 13, 4, 23), 7.0, dtype=dtype)
    view = store[..., :20].transpose(1, 2)
    got = cpuattn.attention(q, k, v, out=view)
    assert got is view and got.data_ptr() == store.data_ptr()
    assert torch.equal(view, want)
    assert bool((store[..., 20:] == 7.0).all())
    # The lse comes back as q's type as well.
    o, lse = cpuattn.attention(q, k, v, return_lse=True)
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (2, 4, 13)


def test_inputs_are_not_copied():
    # out may not overlap an input: cpuattn sees that out aliases q only because q is read in
    # place (a copy of q would not overlap out). bf16 has no NumPy path to fall back on.
    q, k, v = (t.bfloat16() for t in qkv(4, D=20, Dv=20))
    before = q.clone()
    with pytest.raises(ValueError, match=r"out overlaps Q"):
        cpuattn.attention(q, k, v, out=q)
    assert torch.equal(q, before)
    # The same through a view whose storage starts elsewhere (byte offset).
    big = torch.cat([torch.zeros(1, 4, 13, 20, dtype=torch.bfloat16), q])
    with pytest.raises(ValueError, match=r"out overlaps Q"):
        cpuattn.attention(big[1:], k, v, out=big[1:])


def test_a_new_result_shares_memory_with_the_array_cpuattn_made():
    q, k, v = (t.bfloat16() for t in qkv(5))
    out = cpuattn.attention(q, k, v)
    # Written through, read back through torch: the tensor owns the memory it points at.
    ptr = out.data_ptr()
    out.zero_()
    del q, k, v
    import gc
    gc.collect()
    assert out.data_ptr() == ptr and float(out.abs().sum()) == 0.0


def test_mixed_inputs_take_q_s_type():
    q, k, v = qkv(6)
    out = cpuattn.attention(q.numpy(), k, v)
    assert isinstance(out, np.ndarray)
    out = cpuattn.attention(q, k.numpy(), v.numpy())
    assert isinstance(out, torch.Tensor)


def test_varlen_and_paged_take_torch_tensors():
    g = torch.Generator().manual_seed(7)
    lens = [5, 9]
    q, k, v = (randn(g, 14, 4, 16).bfloat16() for _ in range(3))
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    out = cpuattn.attention_varlen(q, k, v, cu, cu, is_causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    for b, (s, n) in enumerate(zip([0, 5], lens)):
        part = cpuattn.attention(*(t[s:s + n].transpose(0, 1) for t in (q, k, v)), is_causal=True)
        assert torch.equal(out[s:s + n], part.transpose(0, 1)), b
    # A paged cache filled from torch bf16 tensors; the query a torch tensor.
    cache = cpuattn.PagedKvCache(num_pages=8, page_size=4, kv_heads=2, head_dim=16,
                                 dtype="bf16")
    seqs = [cache.add_sequence(), cache.add_sequence()]
    kk, vv = (randn(g, 2, 2, 11, 16).bfloat16() for _ in range(2))
    for b in range(2):
        cache.append(seqs[b], kk[b, :, :lens[b]], vv[b, :, :lens[b]])
    qd = randn(g, 2, 4, 1, 16).bfloat16()
    got = cpuattn.attention_paged(qd, **cache.batch(seqs), is_causal="bottom_right")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    for b in range(2):
        want = cpuattn.attention(qd[b:b + 1], kk[b:b + 1, :, :lens[b]], vv[b:b + 1, :, :lens[b]])
        assert torch.equal(got[b:b + 1], want), b


def test_layer_with_bf16_weights_runs_on_torch_bf16_tensors():
    g = torch.Generator().manual_seed(8)
    d, H, Hkv, hd = 64, 4, 2, 16
    w = [randn(g, d, n).mul(d ** -0.5).bfloat16() for n in (H * hd, Hkv * hd, Hkv * hd)]
    wo = randn(g, H * hd, d).mul((H * hd) ** -0.5).bfloat16()
    layer = cpuattn.MultiHeadAttention(d, H, *w, wo, kv_heads=Hkv,
                                       rope={"theta": 10000.0}, qk_norm="head",
                                       q_norm=torch.rand(hd, generator=g) + 0.5,
                                       k_norm=torch.rand(hd, generator=g) + 0.5)
    x = randn(g, 2, 9, d).bfloat16()
    y = layer.forward(x, is_causal=True)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == x.shape
    # The bf16 result is the f32 layer on the same values, rounded to nearest even.
    y32 = layer.forward(x.float(), is_causal=True)
    assert isinstance(y32, torch.Tensor) and y32.dtype == torch.float32
    assert torch.equal(y, y32.bfloat16())
    # Decoding from a cache: prefill 6 tokens, then one at a time; each step equals the causal
    # forward's rows.
    cache = layer.make_cache(2, 9, dtype="bf16")
    got = [layer.decode(x[:, :6], cache)] + [layer.decode(x[:, t:t + 1], cache) for t in (6, 7, 8)]
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.bfloat16 for s in got)
    np.testing.assert_allclose(torch.cat(got, 1).double().numpy(), y.double().numpy(), rtol=0,
                               atol=BF16_ATOL)
    # out= a torch tensor, and a KvCache appended from torch tensors.
    out = torch.empty_like(x)
    assert layer.forward(x, is_causal=True, out=out) is out and torch.equal(out, y)
    c2 = cpuattn.KvCache(2, Hkv, hd, capacity=4, dtype="bf16")
    c2.append(randn(g, 2, Hkv, 3, hd).bfloat16(), randn(g, 2, Hkv, 3, hd))
    assert len(c2) == 3


class FakeDevice:
    """A tensor on another device, as DLPack describes it (no GPU needed)."""

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA

    def __dlpack__(self, stream=None):
        raise AssertionError("a non-CPU tensor must be refused before it is exported")


@pytest.mark.parametrize("name,make,pattern", [
    ("q", lambda q: q.clone().requires_grad_(True),
     r"^cpuattn: q requires grad: cpuattn is inference-only .*q\.detach\(\)"),
    ("q", lambda q: FakeDevice(), r"^cpuattn: q is on cuda:0 \(DLPack device type 2\).*q\.cpu\(\)"),
    ("q", lambda q: q.to(torch.complex64), r"^cpuattn: q has dtype complex64, which cpuattn does "),
    ("v", lambda v: v.to(torch.int32), r"^cpuattn: v has dtype int32; expected float32, "),
])
def test_errors_name_the_argument(name, make, pattern):
    q, k, v = qkv(9)
    args = {"q": q, "k": k, "v": v}
    args[name] = make(args[name])
    with pytest.raises(ValueError, match=pattern):
        cpuattn.attention(args["q"], args["k"], args["v"])


def test_a_consumed_capsule_is_a_named_error():
    q, k, v = qkv(10)
    capsule = torch.utils.dlpack.to_dlpack(q)
    first = cpuattn.attention(capsule, k, v)
    assert isinstance(first, np.ndarray)  # a capsule has no type to answer in
    np.testing.assert_allclose(first, ref_of(q, k, v), rtol=0, atol=tol(37))
    with pytest.raises(ValueError, match=r"^cpuattn: q is a DLPack capsule that was already "
                                         r"consumed"):
        cpuattn.attention(capsule, k, v)
    torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(k))  # torch's own still works


def test_out_that_cannot_be_written_in_place_is_an_error():
    q, k, v = qkv(11)
    with pytest.raises(ValueError, match=r"^cpuattn: out is a <class 'list'>, which cannot be "
                                         r"written in place"):
        cpuattn.attention(q, k, v, out=[[0.0]])
    out = torch.zeros(2, 4, 13, 20)
    with pytest.raises(ValueError, match=r"out has dtype float64"):
        cpuattn.attention(q, k, v, out=out.double())


def test_bool_mask_tensor_is_read_without_dlpack():
    # torch 1.13 cannot export bool through DLPack; NumPy views it (no copy) instead.
    q, k, v = qkv(12)
    mask = torch.rand(13, 37, generator=torch.Generator().manual_seed(12)) > 0.3
    mask[:, 0] = True
    out = cpuattn.attention(q, k, v, attn_mask=mask)
    want = ref_of(q, k, v, mask=mask.numpy())
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=tol(37))


def test_sdpa_drop_in():
    # The README's example: torch bf16 tensors in, a torch bf16 tensor out, as
    # torch.nn.functional.scaled_dot_product_attention's conventions.
    q, k, v = (t.bfloat16() for t in qkv(13, Hkv=4))
    out = cpuattn.attention(q, k, v, is_causal=True)
    F = torch.nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is None:  # torch 1.13
        want = F._scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)[0]
    else:
        want = sdpa(q.float(), k.float(), v.float(), is_causal=True)
    np.testing.assert_allclose(out.float().numpy(), want.numpy(), rtol=0, atol=BF16_ATOL)
    assert math.isfinite(float(out.float().abs().max()))
