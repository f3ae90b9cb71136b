"""The fp32 merge of partial attention results (attnops.torch.merge) and the torch_npu-compatible
npu_ring_attention_update: attention over two key blocks merged equals attention over all keys;
empty blocks and rows; both TND statistics orders; argument checks."""

import math

import pytest
import torch

from attnops.torch import npu_fusion_attention, npu_ring_attention_update
from attnops.torch.merge import (merge_lse, merge_max_sum, tnd_stats_from_token_major, tnd_stats_to_token_major)
from reference import assert_rule, attention_math, from_bnsd, to_bnsd


def make(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sbh_two_key_blocks_merge_to_full_attention(dtype):
    s, b, n, d, sk = 5, 2, 3, 16, 11
    q, k, v = make((s, b, n * d), dtype, 1), make((sk, b, n * d), dtype, 2), make((sk, b, n * d), dtype, 3)
    scale = 1 / math.sqrt(d)
    cut = 4
    o1, m1, s1 = npu_fusion_attention(q, k[:cut], v[:cut], n, "SBH", scale=scale)[:3]
    o2, m2, s2 = npu_fusion_attention(q, k[cut:], v[cut:], n, "SBH", scale=scale)[:3]
    out, mx, sm = npu_ring_attention_update(o1, m1, s1, o2, m2, s2)  # torch_npu's default layout, SBH
    assert out.dtype == dtype and mx.dtype == sm.dtype == torch.float32 and mx.shape == m1.shape
    full, fmax, fsum = npu_fusion_attention(q, k, v, n, "SBH", scale=scale)[:3]
    torch.testing.assert_close(mx, fmax, rtol=0, atol=0)  # the max of maxima is exact
    torch.testing.assert_close(sm, fsum, rtol=1e-5, atol=1e-6)
    ref = from_bnsd(attention_math(to_bnsd(q, "SBH", n), to_bnsd(k, "SBH", n), to_bnsd(v, "SBH", n), scale)[0], "SBH")
    naive = from_bnsd(attention_math(to_bnsd(q, "SBH", n), to_bnsd(k, "SBH", n), to_bnsd(v, "SBH", n), scale,
                                     dtype=dtype)[0], "SBH")
    # Two partial outputs rounded to dtype, merged in fp32 and rounded again: at most about twice
    # the single call's rounding, which the tolerance rule allows.
    assert_rule(out, ref, naive, "merged attention_out")
    assert_rule(full, ref, naive, "single-call attention_out")


def test_merge_with_empty_block_is_identity_and_empty_rows_stay_empty():
    o = make((4, 3, 1, 8), torch.float32, 5)
    m, l = make((4, 3, 1, 1), torch.float32, 6), make((4, 3, 1, 1), torch.float32, 7).abs() + 0.5
    empty_m, empty_l = torch.full_like(m, -math.inf), torch.zeros_like(l)
    out, mx, sm = merge_max_sum(o, m, l, torch.zeros_like(o), empty_m, empty_l)
    assert torch.equal(out, o) and torch.equal(mx, m) and torch.equal(sm, l)
    out, mx, sm = merge_max_sum(torch.zeros_like(o), empty_m, empty_l, o, m, l)
    assert torch.equal(out, o) and torch.equal(mx, m) and torch.equal(sm, l)
    out, mx, sm = merge_max_sum(o, empty_m, empty_l, o, empty_m, empty_l)
    assert torch.equal(out, torch.zeros_like(o)) and torch.isneginf(mx).all() and torch.equal(sm, empty_l)


def test_merge_lse_matches_max_sum_form():
    o1, o2 = make((6, 4), torch.float32, 1), make((6, 4), torch.float32, 2)
    m1, m2 = make((6, 1), torch.float32, 3) * 30, make((6, 1), torch.float32, 4) * 30  # large logits
    l1, l2 = torch.full_like(m1, 2.0), torch.full_like(m2, 3.0)
    out, mx, sm = merge_max_sum(o1, m1, l1, o2, m2, l2)
    out2, lse = merge_lse(o1, m1 + torch.log(l1), o2, m2 + torch.log(l2))
    torch.testing.assert_close(out2, out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, mx + torch.log(sm), rtol=1e-6, atol=1e-6)
    assert torch.isfinite(out2).all()


def test_tnd_statistics_orders():
    """Legacy order: per sequence a head-major [N, s_i, 8] block; token-major: [T, N, 8]."""
    cum = [2, 2, 5]  # lengths 2, 0, 3 (an empty sequence)
    t, n = 5, 2
    token_major = torch.arange(t * n, dtype=torch.float32).view(t, n, 1).expand(t, n, 8).contiguous()
    legacy = tnd_stats_from_token_major(token_major, cum)
    # sequence 0 (tokens 0-1): head 0 rows then head 1 rows; then sequence 2 (tokens 2-4) likewise
    want = [0, 2, 1, 3, 4, 6, 8, 5, 7, 9]
    assert legacy[..., 0].reshape(-1).tolist() == want
    assert torch.equal(tnd_stats_to_token_major(legacy, torch.tensor([0] + cum)), token_major)  # leading 0 accepted
    # Tokens past the last length (a padding tail) form one more block.
    tail = tnd_stats_from_token_major(token_major, [2])
    assert tail[..., 0].reshape(-1).tolist() == [0, 2, 1, 3, 4, 6, 8, 5, 7, 9]
    with pytest.raises(ValueError, match="within T = 5"):
        tnd_stats_to_token_major(legacy, [2, 6])


@pytest.mark.parametrize("softmax_layout", ["", "TND"])
def test_tnd_merge_both_statistics_orders(softmax_layout):
    t, n, d, tk = 7, 2, 64, 9
    cum_q, cum_k = [3, 7], [4, 9]
    q, k, v = make((t, n, d), torch.float32, 1), make((tk, n, d), torch.float32, 2), make((tk, n, d), torch.float32, 3)
    scale = 0.125
    # Keys of each sequence split in two blocks: [first 2 keys] and [the rest].
    first = [0, 1, 4, 5]
    rest = [2, 3, 6, 7, 8]
    parts = []
    for idx, ck in ((first, [2, 4]), (rest, [2, 5])):
        parts.append(npu_fusion_attention(q, k[idx], v[idx], n, "TND", scale=scale, actual_seq_qlen=cum_q,
                                          actual_seq_kvlen=ck, softmax_layout=softmax_layout)[:3])
    (o1, m1, s1), (o2, m2, s2) = parts
    out, mx, sm = npu_ring_attention_update(o1, m1, s1, o2, m2, s2, torch.tensor(cum_q), "TND",
                                            input_softmax_layout=softmax_layout)
    full, fmax, fsum = npu_fusion_attention(q, k, v, n, "TND", scale=scale, actual_seq_qlen=cum_q,
                                            actual_seq_kvlen=cum_k, softmax_layout=softmax_layout)[:3]
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mx, fmax, rtol=0, atol=0)
    torch.testing.assert_close(sm, fsum, rtol=1e-5, atol=1e-6)


def test_argument_checks_name_the_culprit():
    o = torch.zeros(4, 1, 16)
    st = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="input_layout = 'BSH'"):
        npu_ring_attention_update(o, st, st, o, st, st, input_layout="BSH")
    with pytest.raises(ValueError, match="cur_softmax_sum: dtype torch.float64"):
        npu_ring_attention_update(o, st, st, o, st, st.double())
    with pytest.raises(ValueError, match="cur_attn_out: shape"):
        npu_ring_attention_update(o, st, st, o[:2], st, st)
    with pytest.raises(ValueError, match="actual_seq_qlen: None"):
        npu_ring_attention_update(torch.zeros(4, 2, 64), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8),
                                  torch.zeros(4, 2, 64), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), layout="TND")
    with pytest.raises(ValueError, match="input_softmax_layout = 'NTD'"):
        npu_ring_attention_update(o, st, st, o, st, st, input_softmax_layout="NTD")
