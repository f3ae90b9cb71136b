"""Inference attention from Python, KV and output addressing: the NTD and output-transposing
layouts, left padding (query_padding_size / kv_padding_size), the shared prefix and IFA's
kv_padding_size, against the float64 reference of test_infer.py under the tolerance rule."""

import math

import pytest
import torch

from attnops.torch import (npu_fused_infer_attention_score, npu_incre_flash_attention,
                           npu_prompt_flash_attention)
from test_infer import CAUSAL, bottom_right, check, randn


def test_nbsd_and_bnsd_outputs_are_the_plain_output_transposed():
    b, s, n, kvn, d = 2, 3, 4, 2, 64
    q, k, v = randn(b, s, n * d, dtype=torch.float16, seed=1), randn(b, 20, kvn * d, dtype=torch.float16, seed=2), \
        randn(b, 20, kvn * d, dtype=torch.float16, seed=3)
    kw = dict(num_heads=n, num_key_value_heads=kvn, scale=1 / math.sqrt(d), softmax_lse_flag=True)
    plain, lse = npu_fused_infer_attention_score(q, k, v, input_layout="BSH", **kw)
    nbsd, lse_n = npu_fused_infer_attention_score(q, k, v, input_layout="BSH_NBSD", **kw)
    bnsd, lse_b = npu_fused_infer_attention_score(q, k, v, input_layout="BSH_BNSD", **kw)
    assert nbsd.shape == (n, b, s, d) and bnsd.shape == (b, n, s, d) and lse_n.shape == (b, n, s, 1)
    want = plain.view(b, s, n, d)
    assert torch.equal(nbsd, want.permute(2, 0, 1, 3))
    assert torch.equal(bnsd, want.permute(0, 2, 1, 3))
    assert torch.equal(lse_n, lse) and torch.equal(lse_b, lse)
    for i in range(b):
        qi, ki, vi = (x[i].view(x.shape[1], -1, d).transpose(0, 1) for x in (q, k, v))
        check(nbsd[:, i], qi, ki, vi, 1 / math.sqrt(d), torch.ones(s, 20, dtype=torch.bool), torch.float16, f"batch {i}")


@pytest.mark.parametrize("layout", ["NTD", "NTD_TND", "TND_NTD"])
def test_ntd_layouts(layout):
    qlens, kvlens, n, d = [3, 5], [4, 9], 4, 32
    tq, tk = sum(qlens), sum(kvlens)
    q, k, v = (randn(tq if i == 0 else tk, n, d, dtype=torch.bfloat16, seed=10 + i) for i in range(3))
    base, _, out_form = layout.partition("_")
    to_in = (lambda x: x.transpose(0, 1).contiguous()) if base == "NTD" else (lambda x: x)
    out, lse = npu_fused_infer_attention_score(
        to_in(q), to_in(k), to_in(v), atten_mask=CAUSAL, actual_seq_lengths=[3, 8], actual_seq_lengths_kv=[4, 13],
        num_heads=n, scale=0.2, input_layout=layout, sparse_mode=3, softmax_lse_flag=True)
    assert lse.shape == (tq, n, 1)
    out_tnd = out.transpose(0, 1) if (out_form or base) == "NTD" else out
    q0 = k0 = 0
    for sq, skv in zip(qlens, kvlens):
        qi, ki, vi = (x.transpose(0, 1) for x in (q[q0:q0 + sq], k[k0:k0 + skv], v[k0:k0 + skv]))
        check(out_tnd[q0:q0 + sq].transpose(0, 1), qi, ki, vi, 0.2, bottom_right(sq, skv), torch.bfloat16, layout)
        q0, k0 = q0 + sq, k0 + skv


def test_prompt_bnsd_bsnd():
    b, s, n, d = 1, 24, 4, 64
    q, k, v = (randn(b, n, s, d, dtype=torch.float16, seed=i) for i in (7, 8, 9))
    out = npu_prompt_flash_attention(q, k, v, atten_mask=CAUSAL, sparse_mode=3, num_heads=n, scale_value=0.125,
                                     input_layout="BNSD_BSND")
    assert out.shape == (b, s, n, d)
    check(out[0].transpose(0, 1), q[0], k[0], v[0], 0.125, bottom_right(s, s), torch.float16, "BNSD_BSND")


def test_left_padding():
    b, qs, kvs, n, kvn, d = 2, 10, 16, 4, 2, 32
    qlens, kvlens, qpad, kvpad = [4, 7], [9, 12], 2, 3
    q = randn(b, qs, n, d, dtype=torch.float16, seed=20)
    k, v = randn(b, kvs, kvn, d, dtype=torch.float16, seed=21), randn(b, kvs, kvn, d, dtype=torch.float16, seed=22)
    out, lse = npu_fused_infer_attention_score(
        q, k, v, atten_mask=CAUSAL, actual_seq_lengths=qlens, actual_seq_lengths_kv=kvlens,
        query_padding_size=torch.tensor([qpad]), kv_padding_size=torch.tensor([kvpad]), num_heads=n,
        num_key_value_heads=kvn, scale=0.15, input_layout="BSND", sparse_mode=3, softmax_lse_flag=True)
    for i in range(b):
        q0, k0 = qs - qpad - qlens[i], kvs - kvpad - kvlens[i]
        qi = q[i, q0:q0 + qlens[i]].transpose(0, 1)
        ki, vi = (x[i, k0:k0 + kvlens[i]].transpose(0, 1) for x in (k, v))
        check(out[i, q0:q0 + qlens[i]].transpose(0, 1), qi, ki, vi, 0.15, bottom_right(qlens[i], kvlens[i]),
              torch.float16, f"batch {i}")
        assert torch.all(out[i, :q0] == 0) and torch.all(out[i, q0 + qlens[i]:] == 0)
        assert torch.all(torch.isinf(lse[i, :, :q0]))


def test_incre_kv_padding_and_window_before_row_0():
    b, kvs, n, d = 2, 20, 2, 64
    q = randn(b, 1, n * d, dtype=torch.bfloat16, seed=30)
    k, v = randn(b, kvs, n * d, dtype=torch.bfloat16, seed=31), randn(b, kvs, n * d, dtype=torch.bfloat16, seed=32)
    out = npu_incre_flash_attention(q, k, v, actual_seq_lengths=[5, 18], kv_padding_size=torch.tensor([4]),
                                    num_heads=n, scale_value=0.125, input_layout="BSH")
    k0 = kvs - 4 - 5
    qi = q[0].view(1, n, d).transpose(0, 1)
    ki, vi = (x[0, k0:k0 + 5].view(5, n, d).transpose(0, 1) for x in (k, v))
    check(out[0].view(1, n, d).transpose(0, 1), qi, ki, vi, 0.125, torch.ones(1, 5, dtype=torch.bool),
          torch.bfloat16, "batch 0")
    assert torch.all(out[1] == 0)  # 20 - 4 - 18 < 0: the window starts before row 0


def test_shared_prefix_is_prepended_to_every_batch():
    b, s, kvs, ps, n, d = 2, 6, 12, 8, 4, 32
    q = randn(b, n, s, d, dtype=torch.float16, seed=40)
    k, v = randn(b, n, kvs, d, dtype=torch.float16, seed=41), randn(b, n, kvs, d, dtype=torch.float16, seed=42)
    pk, pv = randn(1, n, ps, d, dtype=torch.float16, seed=43), randn(1, n, ps, d, dtype=torch.float16, seed=44)
    kvlens, lp = [7, 12], 5
    out, _ = npu_fused_infer_attention_score(
        q, k, v, atten_mask=CAUSAL, actual_seq_lengths_kv=kvlens, key_shared_prefix=pk, value_shared_prefix=pv,
        actual_shared_prefix_len=[lp], num_heads=n, scale=0.2, input_layout="BNSD", sparse_mode=3)
    for i in range(b):
        ki = torch.cat([pk[0, :, :lp], k[i, :, :kvlens[i]]], dim=1)
        vi = torch.cat([pv[0, :, :lp], v[i, :, :kvlens[i]]], dim=1)
        check(out[i], q[i], ki, vi, 0.2, bottom_right(s, lp + kvlens[i]), torch.float16, f"batch {i}")


def test_addressing_rules_raise():
    q = randn(1, 4, 2, 16, dtype=torch.float16, seed=1)
    with pytest.raises(ValueError, match="input_layout"):
        npu_fused_infer_attention_score(q, q, q, num_heads=4, input_layout="BNSD_TND")
    with pytest.raises(ValueError, match="actualSeqLengthsKv"):
        npu_fused_infer_attention_score(q, q, q, num_heads=4, input_layout="BNSD", kv_padding_size=torch.tensor([0]))
    with pytest.raises(ValueError, match="valueSharedPrefix"):
        npu_fused_infer_attention_score(q, q, q, num_heads=4, input_layout="BNSD", key_shared_prefix=q[:1])
