"""attnops.torch's flash-attn 2 interface against float64 PyTorch maths with flash-attn's own
conventions: bottom-right causal alignment, windows, ALiBi, GQA, varlen cu_seqlens, packed
inputs, LSE."""

import math

import pytest
import torch

from attnops.torch import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                           flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from reference import assert_rule, attention_math


def fa_mask(sq, sk, causal, window):
    """flash-attn's mask (True = masked): query i sees keys j with
    i + sk - sq - left <= j <= i + sk - sq + right (right = 0 when causal; -1 = unbounded)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    masked = torch.zeros(sq, sk, dtype=torch.bool)
    if right >= 0:
        masked |= j > i + right
    if left >= 0:
        masked |= j < i - left
    return masked


def fa_math(q, k, v, causal=False, window=(-1, -1), scale=None, alibi=None, dtype=torch.float64):
    """flash-attn semantics for one batch of [B,S,H,D] tensors; returns out [B,Sq,H,Dv], lse [B,H,Sq]."""
    sq, sk = q.shape[1], k.shape[1]
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    bias = None
    if alibi is not None:
        i = torch.arange(sq, dtype=torch.float64)[:, None] + sk - sq
        j = torch.arange(sk, dtype=torch.float64)[None, :]
        s = alibi.double().view(1, -1, 1, 1) if alibi.dim() == 1 else alibi.double()[:, :, None, None]
        bias = -s * (i - j).abs()
    masked = fa_mask(sq, sk, causal, window) if causal or window != (-1, -1) else None
    out, m, l = attention_math(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, masked, bias, 0,
                               dtype=dtype)
    return out.transpose(1, 2), m + torch.log(l)


def check(q, k, v, got_out, dout, **kw):
    """Compares got_out and q/k/v.grad (from dout) with the maths in float64 and naive precision."""
    res = {}
    for tag, dt in (("ref", torch.float64), ("naive", q.dtype)):
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o, lse = fa_math(*xs, dtype=dt, **kw)
        o.backward(dout.to(dt))
        res[tag] = [o.detach(), lse.detach()] + [x.grad for x in xs]
    assert_rule(got_out, res["ref"][0], res["naive"][0], "out")
    for name, t, i in (("dq", q, 2), ("dk", k, 3), ("dv", v, 4)):
        assert_rule(t.grad, res["ref"][i], res["naive"][i], name)
    return res["ref"][1]


def leaf(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sq,sk,causal,window", [
    (6, 6, False, (-1, -1)),
    (5, 9, True, (-1, -1)),
    (9, 5, True, (-1, -1)),   # first rows see no key: output 0, as flash-attn
    (8, 8, False, (2, 1)),
    (6, 10, True, (3, -1)),
    (7, 7, False, (-1, 2)),
])
def test_flash_attn_func(sq, sk, causal, window, dtype):
    q, k, v = leaf((2, sq, 4, 16), dtype, 1), leaf((2, sk, 2, 16), dtype, 2), leaf((2, sk, 2, 16), dtype, 3)
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 4, sq) and lse.dtype == torch.float32
    dout = leaf(out.shape, dtype, 4).detach()
    out.backward(dout)
    ref_lse = check(q, k, v, out, dout, causal=causal, window=window)
    live = torch.isfinite(ref_lse)
    assert torch.equal(live, torch.isfinite(lse))
    torch.testing.assert_close(lse[live].double(), ref_lse[live], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slopes_shape", [(4,), (2, 4)])
def test_alibi(slopes_shape):
    q, k, v = leaf((2, 5, 4, 8), torch.float32, 5), leaf((2, 8, 4, 8), torch.float32, 6), leaf((2, 8, 4, 8), torch.float32, 7)
    slopes = torch.rand(slopes_shape, generator=torch.Generator().manual_seed(1))
    out = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, softmax_scale=0.2)
    dout = leaf(out.shape, torch.float32, 8).detach()
    out.backward(dout)
    check(q, k, v, out, dout, causal=True, alibi=slopes, scale=0.2)


def test_packed_variants_read_in_place():
    qkv = leaf((2, 6, 3, 4, 8), torch.float32, 9)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (x.detach().clone().requires_grad_() for x in qkv.unbind(2))
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))
    out.sum().backward()
    flash_attn_func(q, k, v, causal=True).sum().backward()
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], 2))
    kv = torch.stack([k, v], 2).detach()
    assert torch.equal(flash_attn_kvpacked_func(q.detach(), kv, causal=True), out.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 0))])
def test_varlen(dtype, causal, window):
    qlens, klens = [3, 0, 5, 1], [4, 2, 7, 1]
    cu_q = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(klens).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = leaf((9, 4, 8), dtype, 1), leaf((14, 2, 8), dtype, 2), leaf((14, 2, 8), dtype, 3)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(qlens), max(klens), causal=causal,
                                         window_size=window, return_attn_probs=True)
    assert out.shape == (9, 4, 8) and lse.shape == (4, 9)
    dout = leaf(out.shape, dtype, 4).detach()
    out.backward(dout)
    for i in range(len(qlens)):
        a, b, c, d = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        qs, ks, vs = (x.detach()[s:e][None].clone().requires_grad_() for x, s, e in ((q, a, b), (k, c, d), (v, c, d)))
        res = {}
        for tag, dt in (("ref", torch.float64), ("naive", dtype)):
            xs = [x.detach().clone().requires_grad_() for x in (qs, ks, vs)]
            o, l = fa_math(*xs, causal=causal, window=window, dtype=dt)
            o.backward(dout[a:b][None].to(dt))
            res[tag] = [o.detach()[0], l.detach()[0]] + [x.grad[0] for x in xs]
        assert_rule(out[a:b], res["ref"][0], res["naive"][0], f"out seq {i}")
        for name, g, j, s, e in (("dq", q.grad, 2, a, b), ("dk", k.grad, 3, c, d), ("dv", v.grad, 4, c, d)):
            assert_rule(g[s:e], res["ref"][j], res["naive"][j], f"{name} seq {i}")
        live = torch.isfinite(res["ref"][1])
        torch.testing.assert_close(lse[:, a:b][live].double(), res["ref"][1][live], rtol=1e-5, atol=1e-5)


def test_varlen_packed_and_alibi():
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    qkv = leaf((9, 3, 2, 8), torch.float32, 3)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, 5, causal=True)
    q, k, v = qkv.detach().unbind(1)
    assert torch.equal(out.detach(), flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True))
    kv = torch.stack([k, v], 1)
    assert torch.equal(out.detach(), flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 5, 5, causal=True))
    slopes = torch.tensor([0.3, 0.7])
    got = flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True, alibi_slopes=slopes)
    for s, e in ((0, 4), (4, 9)):
        expect, _ = fa_math(q[s:e][None], k[s:e][None], v[s:e][None], causal=True, alibi=slopes)
        torch.testing.assert_close(got[s:e].double(), expect[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_varlen_func(q, k, v, cu, torch.tensor([0, 5, 9], dtype=torch.int32), 5, 5, alibi_slopes=slopes)


def test_dropout_and_unsupported_arguments():
    q = leaf((1, 6, 2, 8), torch.float32, 1).detach()
    torch.manual_seed(0)
    a = flash_attn_func(q, q, q, dropout_p=0.3)
    torch.manual_seed(0)
    b = flash_attn_func(q, q, q, dropout_p=0.3)
    assert torch.equal(a, b) and not torch.equal(a, flash_attn_func(q, q, q))
    with pytest.raises(ValueError, match="softcap"):
        flash_attn_func(q, q, q, softcap=5.0)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=1.0)
