"""The kernel support of context parallelism through the binding: the extended entry points
(attnops.torch._ops.flash_attention_score_ex / _grad_ex: dropout keyed by global positions, fp32
outputs and gradients from bf16, gradients added into fp32 accumulators) and the AttentionMerge op
behind attnops.torch.merge."""

import math

import torch

from attnops.torch import _ops
from attnops.torch import merge as merge_mod

I32 = _ops.INT32_MAX


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def test_query_row_shards_with_global_dropout_equal_the_whole_call():
    b, s, n, d = 2, 16, 4, 8
    q, k, v, dy = (rand(b, s, n, d, seed=i) for i in range(4))
    args = (None, None, None, 0.3, 0.75, I32, I32, n, "BSND", 0, 1234, 5)
    whole = _ops.flash_attention_score_ex(q, k, v, *args)
    wg = _ops.flash_attention_score_grad_ex(q, k, v, dy, None, whole[1], whole[2], whole[0], None, None, 0.3, 0.75,
                                            I32, I32, n, "BSND", 0, 1234, 5)
    rows = [torch.tensor([0, 1, 2, 3, 12, 13, 14, 15]), torch.arange(4, 12)]  # zigzag W = 2
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for r in rows:
        geo = _ops.DropoutGeometry(head_num=n, q_seq_len=s, kv_seq_len=s, q_rows=r)
        o, mx, sm = _ops.flash_attention_score_ex(q[:, r], k, v, *args, drop=geo)
        assert torch.equal(o, whole[0][:, r])
        plain = _ops.flash_attention_score_ex(q[:, r], k, v, *args)[0]  # local bits: different
        assert not torch.equal(plain, o)
        dq_r, dk_r, dv_r, _ = _ops.flash_attention_score_grad_ex(q[:, r], k, v, dy[:, r], None, mx, sm, o, None, None,
                                                                 0.3, 0.75, I32, I32, n, "BSND", 0, 1234, 5, drop=geo)
        assert torch.equal(dq_r, wg[0][:, r])
        dk += dk_r
        dv += dv_r
    torch.testing.assert_close(dk, wg[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dv, wg[2], rtol=1e-5, atol=1e-6)


def test_fp32_outputs_and_accumulated_gradients_from_bf16():
    b, s, n, d = 1, 40, 2, 16
    q, k, v, dy = (rand(b, s, n, d, dtype=torch.bfloat16, seed=i) for i in range(4))
    args = (None, None, None, 0.25, 1.0, I32, I32, n, "BSND", 0)
    o, mx, sm = _ops.flash_attention_score_ex(q, k, v, *args, out_dtype=torch.float32)
    assert o.dtype == torch.float32
    o32 = _ops.flash_attention_score_ex(q.float(), k.float(), v.float(), *args)[0]
    torch.testing.assert_close(o, o32, rtol=1e-5, atol=1e-6)
    g = _ops.flash_attention_score_grad_ex(q, k, v, dy, None, mx, sm, o, None, None, 0.25, 1.0, I32, I32, n, "BSND", 0,
                                           grad_dtype=torch.float32)
    acc = [rand(*t.shape, seed=9) for t in (q, k, v)]
    before = [t.clone() for t in acc]
    _ops.flash_attention_score_grad_ex(q, k, v, dy, None, mx, sm, o, None, None, 0.25, 1.0, I32, I32, n, "BSND", 0,
                                       dq=acc[0], dk=acc[1], dv=acc[2], accumulate=True)
    for a, x, gr in zip(acc, before, g[:3]):
        assert torch.equal(a, x + gr)


def torch_merge(o1, m1, s1, o2, m2, s2):
    m = torch.maximum(m1, m2)
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    a, b = s1 * torch.exp(m1 - shift), s2 * torch.exp(m2 - shift)
    s = a + b
    safe = torch.where(s > 0, s, torch.ones_like(s))
    return (o1.float() * torch.where(s > 0, a / safe, 0 * s) + o2.float() * torch.where(s > 0, b / safe, 0 * s)), m, s


def test_merge_op_matches_the_formula_and_updates_in_place():
    s_, b, n, d = 6, 2, 3, 5
    o1, o2 = rand(s_, b, n, d, seed=1), rand(s_, b, n, d, seed=2)
    stats = rand(4, b, n, s_, 8, seed=3)
    m1, m2 = stats[0] * 4, stats[2] * 4
    s1, s2 = stats[1].abs() + 0.5, stats[3].abs() + 0.5
    m1[0, 0, 0] = -math.inf  # an empty row in the first block
    s1[0, 0, 0] = 0.0
    rows = [x[..., :1].permute(2, 0, 1, 3) for x in (m1, s1, m2, s2)]  # strided [S,B,N,1] views
    got = merge_mod.merge_max_sum(o1, rows[0], rows[1], o2, rows[2], rows[3])
    want = torch_merge(o1, *rows[:2], o2, *rows[2:])
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=2e-6, atol=1e-7)
    assert torch.equal(got[0][0, 0, 0], o2[0, 0, 0])  # the empty block contributes nothing
    # In place over the previous result, then the log-sum-exp form.
    out, mo, so = o1.clone(), rows[0].clone(), rows[1].clone()
    from attnops import _C
    _C.attention_merge(out, mo, so, o2, rows[2], rows[3], out, mo, so)
    assert torch.equal(out, got[0]) and torch.equal(mo, got[1]) and torch.equal(so, got[2])
    lse1, lse2 = rows[0] + torch.log(rows[1]), rows[2] + torch.log(rows[3])
    o_l, lse = merge_mod.merge_lse(o1, lse1, o2, lse2)
    torch.testing.assert_close(o_l, got[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, got[1] + torch.log(got[2]), rtol=1e-5, atol=1e-6)
