"""attnops.torch.npu_fusion_attention / npu_fusion_attention_grad against float64 PyTorch maths:
layouts, GQA, Dv < D, sparse modes, varlen TND, pse, sink, dropout, dtypes; values and gradients."""

import math

import pytest
import torch

from attnops.torch import npu_fusion_attention, npu_fusion_attention_grad, npu_gen_drop_mask
from reference import (INT32_MAX, alibi_bias, assert_rule, attention_math, from_bnsd, mask_for_mode, mode_mask, to_bnsd,
                       unpack_bits)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def layout_shape(layout, b, n, s, d):
    return {"BNSD": (b, n, s, d), "BSND": (b, s, n, d), "BSH": (b, s, n * d), "SBH": (s, b, n * d)}[layout]


def run_fixed(layout, dtype, n1=4, n2=2, sq=5, sk=7, d=16, dv=8, b=2, mode=0, pre=INT32_MAX, nxt=INT32_MAX,
              atten_mask=None, prefix=None, pse=None, pse_type=1, keep_prob=1.0, sink=None, q_start=None,
              kv_start=None, seed=0, auto_mask=True):
    """Runs forward + autograd backward through attnops and through the maths (float64 and naive),
    and checks out, softmax_max/sum and dq/dk/dv (and dsink) by the tolerance rule. With auto_mask,
    a missing atten_mask becomes the one the mode needs (mask_for_mode); without, None stays None:
    no masking at all."""
    if atten_mask is None and auto_mask:
        atten_mask = mask_for_mode(mode, sq, sk, pre, nxt)
    q = make(layout_shape(layout, b, n1, sq, d), dtype, seed).requires_grad_()
    k = make(layout_shape(layout, b, n2, sk, d), dtype, seed + 1).requires_grad_()
    v = make(layout_shape(layout, b, n2, sk, dv), dtype, seed + 2).requires_grad_()
    scale = 1 / math.sqrt(d)
    sink_t = sink.clone().requires_grad_() if sink is not None else None
    torch.manual_seed(seed)
    out, smax, ssum, sout, dseed, doff, numels = npu_fusion_attention(
        q, k, v, n1, layout, pse=pse, atten_mask=atten_mask, scale=scale, keep_prob=keep_prob, pre_tockens=pre,
        next_tockens=nxt, prefix=prefix, sparse_mode=mode, pse_type=pse_type, sink=sink_t, q_start_idx=q_start,
        kv_start_idx=kv_start)
    assert out.shape == layout_shape(layout, b, n1, sq, dv) and out.dtype == dtype
    assert smax.shape == (b, n1, sq, 8) and smax.dtype == torch.float32 and sout.numel() == 0
    assert torch.equal(smax, smax[..., :1].expand_as(smax)) and torch.equal(ssum, ssum[..., :1].expand_as(ssum))
    dout = make(out.shape, dtype, seed + 3)
    out.backward(dout)

    keep = None
    if keep_prob < 1.0:
        assert numels == b * n1 * sq * sk
        mask = npu_gen_drop_mask(q, k, n1, layout, keep_prob, dseed, doff)
        keep = unpack_bits(mask, numels).view(b, n1, sq, sk)
    pre_pse = alibi_bias(pse, sq, sk, q_start[0], kv_start[0], pse_type == 3) if pse_type >= 2 else pse
    masked = None
    if atten_mask is not None:
        masked = torch.stack([mode_mask(mode, sq, sk, pre, nxt, atten_mask, prefix[i] if prefix else None)
                              .expand(n1, sq, sk) if atten_mask.dim() == 2 or mode not in (0, 1, 5) else
                              mode_mask(mode, sq, sk, pre, nxt, atten_mask[i % atten_mask.shape[0]], None)
                              .expand(n1, sq, sk) for i in range(b)])
    results = {}
    for tag, dt in (("ref", torch.float64), ("naive", dtype)):
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        ss = sink.clone().requires_grad_() if sink is not None else None
        o, m, l = attention_math(to_bnsd(qq, layout, n1), to_bnsd(kk, layout, n2), to_bnsd(vv, layout, n2), scale,
                                 masked, pre_pse, pse_type, keep, keep_prob, ss, dt)
        o = from_bnsd(o, layout)
        o.backward(dout.to(o.dtype))
        results[tag] = (o.detach(), m.detach(), l.detach(), qq.grad, kk.grad, vv.grad, ss.grad if ss is not None else None)
    ref, naive = results["ref"], results["naive"]
    assert_rule(out, ref[0], naive[0], "attention_out")
    # Statistics: fp32 in attnops; compare where the row has keys (else -inf / 0 exactly).
    live = torch.isfinite(ref[1])
    assert torch.equal(live, torch.isfinite(smax[..., 0]))
    assert torch.all(ssum[..., 0][~live] == 0)
    torch.testing.assert_close(smax[..., 0][live].double(), ref[1][live], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssum[..., 0][live].double(), ref[2][live], rtol=1e-4, atol=1e-5)
    for name, got, i in (("dq", q.grad, 3), ("dk", k.grad, 4), ("dv", v.grad, 5)):
        assert got.shape == ref[i].shape and got.dtype == dtype
        assert_rule(got, ref[i], naive[i], name)
    if sink is not None:
        torch.testing.assert_close(sink_t.grad.double(), ref[6].double(), rtol=1e-4, atol=1e-5)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
def test_layouts_gqa_dtypes(layout, dtype):
    run_fixed(layout, dtype)


@pytest.mark.parametrize("mode,sq,sk,pre,nxt", [
    (0, 6, 9, 2, 1),        # top-left band, no mask tensor
    (0, 9, 6, 3, 0),        # causal band with Sq > Sk (rows without keys give 0)
    (2, 6, 9, INT32_MAX, INT32_MAX),
    (3, 6, 9, INT32_MAX, INT32_MAX),
    (3, 9, 6, INT32_MAX, INT32_MAX),  # bottom-right causal, first rows see nothing
    (4, 7, 7, 2, 1),
    (4, 5, 9, 3, 0),
])
def test_sparse_modes(mode, sq, sk, pre, nxt):
    run_fixed("BNSD", torch.float32, sq=sq, sk=sk, mode=mode, pre=pre, nxt=nxt)


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 4, 5, 6])
def test_null_mask_means_full_attention(mode):
    """A None atten_mask means no masking at all, whatever the mode and tokens (spec section 0)."""
    out = run_fixed("BNSD", torch.float32, sq=6, sk=9, mode=mode, pre=1, nxt=0, prefix=[7, 8] if mode >= 5 else None,
                    auto_mask=False)
    full = run_fixed("BNSD", torch.float32, sq=6, sk=9, mode=1, auto_mask=False)
    assert torch.equal(out, full)


def test_explicit_mask_modes_and_prefix():
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(6, 9, generator=g) < 0.3
    run_fixed("BSND", torch.float32, sq=6, sk=9, mode=0, atten_mask=mask)
    run_fixed("BSND", torch.float32, sq=6, sk=9, mode=1, atten_mask=mask)
    run_fixed("BNSD", torch.bfloat16, sq=6, sk=9, mode=0, atten_mask=mask.expand(2, 1, 6, 9).contiguous())
    run_fixed("BNSD", torch.float32, sq=6, sk=9, mode=6, prefix=[4, 7],
              atten_mask=torch.zeros(3072, 2048, dtype=torch.bool))


@pytest.mark.parametrize("pse_type", [0, 1])
def test_pse_tensor(pse_type):
    pse = make((2, 4, 5, 7), torch.float32, 11)
    run_fixed("BSH", torch.float32, pse=pse, pse_type=pse_type)


@pytest.mark.parametrize("pse_type", [2, 3])
def test_inner_alibi(pse_type):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    bias = alibi_bias(slopes, 6, 6, 2, 1, sqrt=pse_type == 3)
    out = run_fixed("BNSD", torch.float32, sq=6, sk=6, pse=slopes, pse_type=pse_type, q_start=[2], kv_start=[1])
    q = make((2, 4, 6, 16), torch.float32, 0)
    k = make((2, 2, 6, 16), torch.float32, 1)
    v = make((2, 2, 6, 8), torch.float32, 2)
    expect, _, _ = attention_math(q, k, v, 0.25, pse=bias, pse_type=2)
    torch.testing.assert_close(out.detach().double(), expect, rtol=1e-5, atol=1e-5)


def test_sink():
    run_fixed("BNSD", torch.float32, sink=torch.tensor([0.5, -1.0, 2.0, 0.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_regenerated_in_backward(dtype):
    out = run_fixed("BSND", dtype, keep_prob=0.7, seed=3)
    # Same seed from the same generator state: the same mask and bits.
    again = run_fixed("BSND", dtype, keep_prob=0.7, seed=3)
    assert torch.equal(out, again)


def test_grad_function_matches_autograd():
    q, k, v = make((4, 8, 16), torch.float32, 1), make((6, 8, 16), torch.float32, 2), make((6, 8, 16), torch.float32, 3)
    for t in (q, k, v):
        t.requires_grad_()
    out, smax, ssum, _, seed, offset, numels = npu_fusion_attention(
        q, k, v, 8, "TND", scale=0.25, keep_prob=0.9, atten_mask=mask_for_mode(3, 2, 3), sparse_mode=3, actual_seq_qlen=[2, 4],
        actual_seq_kvlen=[3, 6], pre_tockens=INT32_MAX, next_tockens=0)
    assert numels == 8 * (2 * 3 + 2 * 3)
    dy = make(out.shape, torch.float32, 9)
    out.backward(dy)
    dq, dk, dv, dpse = npu_fusion_attention_grad(
        q, k, v, dy, 8, "TND", softmax_max=smax, softmax_sum=ssum, attention_in=out, scale_value=0.25,
        keep_prob=0.9, seed=seed, offset=offset, numels=numels, atten_mask=mask_for_mode(3, 2, 3), sparse_mode=3,
        actual_seq_qlen=[2, 4],
        actual_seq_kvlen=[3, 6], next_tockens=0)
    assert torch.equal(dq, q.grad) and torch.equal(dk, k.grad) and torch.equal(dv, v.grad)
    assert dpse.numel() == 0


def tnd_case(dtype, qlens, kvlens, n1, n2, mode, pre=INT32_MAX, nxt=INT32_MAX, keep_prob=1.0, tail=0, seed=0,
             auto_mask=True):
    d, dv = 12, 12
    t1, t2 = sum(qlens) + tail, sum(kvlens) + tail
    q = make((t1, n1, d), dtype, seed).requires_grad_()
    k = make((t2, n2, d), dtype, seed + 1).requires_grad_()
    v = make((t2, n2, dv), dtype, seed + 2).requires_grad_()
    cq = torch.tensor(qlens).cumsum(0).tolist()
    ck = torch.tensor(kvlens).cumsum(0).tolist()
    scale = 0.3
    mask = mask_for_mode(mode, max(qlens), max(kvlens), pre, nxt) if auto_mask else None
    out, smax, ssum, _, s, o, numels = npu_fusion_attention(
        q, k, v, n1, "TND", atten_mask=mask, scale=scale, keep_prob=keep_prob, pre_tockens=pre, next_tockens=nxt,
        sparse_mode=mode, actual_seq_qlen=cq, actual_seq_kvlen=ck, softmax_layout="TND")
    assert out.shape == (t1, n1, dv) and smax.shape == (t1, n1, 8)
    dout = make(out.shape, dtype, seed + 3)
    out.backward(dout)
    keep_bits = None
    if keep_prob < 1:
        assert numels == n1 * sum(a * c for a, c in zip(qlens, kvlens))
        keep_bits = unpack_bits(npu_gen_drop_mask(q, k, n1, "TND", keep_prob, s, o, cq, ck), numels)
    res = {}
    for tag, dt in (("ref", torch.float64), ("naive", dtype)):
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        outs, maxs = torch.zeros(t1, n1, dv, dtype=dt), torch.full((t1, n1), -math.inf, dtype=torch.float64)
        a = c = used = 0
        pieces = []
        nonempty = [i for i, (x, y) in enumerate(zip(qlens, kvlens)) if x > 0 and y > 0]

        def seq_mode(m, i):
            """Modes 7/8: one sequence (last/first non-empty) takes the bottom-right band (mode 4),
            the others bottom-right (7) or top-left (8) causal."""
            if m == 7:
                return 4 if i == nonempty[-1] else 3
            if m == 8:
                return 4 if i == nonempty[0] else 2
            return m

        for idx, (sq, sk) in enumerate(zip(qlens, kvlens)):
            bits = None
            if keep_bits is not None:
                bits = keep_bits[used:used + n1 * sq * sk].view(1, n1, sq, sk)
                used += n1 * sq * sk
            qs = qq[a:a + sq].permute(1, 0, 2)[None]
            ks = kk[c:c + sk].permute(1, 0, 2)[None]
            vs = vv[c:c + sk].permute(1, 0, 2)[None]
            masked = mode_mask(seq_mode(mode, idx), sq, sk, pre, nxt, mask[:sq, :sk] if mode == 0 else None) \
                if mask is not None else None
            o_, m_, _ = attention_math(qs, ks, vs, scale, masked, keep=bits, keep_prob=keep_prob, dtype=dt)
            pieces.append(o_[0].permute(1, 0, 2))
            maxs[a:a + sq] = m_[0].T.double()
            a, c = a + sq, c + sk
        outs = torch.cat(pieces + [torch.zeros(tail, n1, dv, dtype=dt)])
        outs.backward(dout.to(dt))
        res[tag] = (outs.detach(), maxs, qq.grad, kk.grad, vv.grad)
    assert_rule(out, res["ref"][0], res["naive"][0], "attention_out")
    live = torch.isfinite(res["ref"][1])
    assert torch.equal(live, torch.isfinite(smax[..., 0]))
    torch.testing.assert_close(smax[..., 0][live].double(), res["ref"][1][live], rtol=1e-5, atol=1e-5)
    for name, got, i in (("dq", q.grad, 2), ("dk", k.grad, 3), ("dv", v.grad, 4)):
        assert_rule(got, res["ref"][i], res["naive"][i], name)
    if tail:
        assert torch.all(out[-tail:] == 0) and torch.all(q.grad[-tail:] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,pre,nxt", [(0, INT32_MAX, INT32_MAX), (2, INT32_MAX, INT32_MAX),
                                          (3, INT32_MAX, INT32_MAX), (4, 3, 0), (0, 2, 2)])
def test_varlen_tnd(dtype, mode, pre, nxt):
    tnd_case(dtype, [3, 0, 5, 1, 4], [4, 2, 5, 1, 6], 4, 2, mode, pre, nxt, tail=2)


@pytest.mark.parametrize("mode,pre,nxt", [(7, 6, -1), (8, 4, 0)])
def test_varlen_split_modes(mode, pre, nxt):
    tnd_case(torch.float32, [3, 0, 5, 1, 4], [4, 2, 5, 1, 6], 4, 2, mode, pre, nxt, tail=1)


@pytest.mark.parametrize("mode,pre,nxt", [(3, INT32_MAX, INT32_MAX), (7, 6, -1), (8, 4, 0), (0, 1, 0)])
def test_varlen_null_mask_means_full_attention(mode, pre, nxt):
    tnd_case(torch.float32, [3, 0, 5, 1, 4], [4, 2, 5, 1, 6], 4, 2, mode, pre, nxt, tail=1, auto_mask=False)


def test_varlen_tnd_dropout():
    tnd_case(torch.float32, [3, 5, 2], [4, 5, 3], 2, 1, 3, keep_prob=0.8, seed=4)


def test_varlen_lists_may_be_tensors():
    q = make((6, 2, 8), torch.float32, 1)
    a = npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=[2, 6], actual_seq_kvlen=[2, 6])[0]
    b = npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=torch.tensor([2, 6]),
                             actual_seq_kvlen=torch.tensor([2, 6], dtype=torch.int32))[0]
    assert torch.equal(a, b)


def test_tnd_statistics_default_order_is_per_sequence_head_major():
    """torch_npu's default TND statistics order (softmax_layout ""): per sequence a head-major
    [N, s_i, 8] block, as MindSpeed's TND ring reads them; "TND" gives them token-major. The grad
    takes either order back when told the same."""
    from attnops.torch.merge import tnd_stats_from_token_major

    q = make((7, 2, 8), torch.float32, 1)
    cq = [3, 7]
    _, m_tnd, s_tnd = npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=cq, actual_seq_kvlen=cq,
                                           softmax_layout="TND")[:3]
    out, m_def, s_def = npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=cq, actual_seq_kvlen=cq)[:3]
    assert torch.equal(m_def, tnd_stats_from_token_major(m_tnd, cq))
    assert torch.equal(s_def, tnd_stats_from_token_major(s_tnd, cq))
    # Sequence 0 (3 tokens): head 0's rows, then head 1's. Flat element 1 (declared [0, 1]) is
    # (token 1, head 0); flat element 3 (declared [1, 1]) is (token 0, head 1).
    assert m_def[0, 1, 0] == m_tnd[1, 0, 0] and m_def[1, 1, 0] == m_tnd[0, 1, 0]
    dy = make(out.shape, torch.float32, 2)
    g_def = npu_fusion_attention_grad(q, q, q, dy, 2, "TND", softmax_max=m_def, softmax_sum=s_def, attention_in=out,
                                      actual_seq_qlen=cq, actual_seq_kvlen=cq)
    g_tnd = npu_fusion_attention_grad(q, q, q, dy, 2, "TND", softmax_max=m_tnd, softmax_sum=s_tnd, attention_in=out,
                                      actual_seq_qlen=cq, actual_seq_kvlen=cq, softmax_layout="TND")
    for a, b in zip(g_def[:3], g_tnd[:3]):
        assert torch.equal(a, b)
