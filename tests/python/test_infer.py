"""Inference attention from Python: torch_npu's npu_fused_infer_attention_score(_v2),
npu_incre_flash_attention, npu_prompt_flash_attention and flash-attn's flash_attn_with_kvcache,
against a float64 reference written here (dense masks, softmax, matmul) under the tolerance rule."""

import math

import pytest
import torch

from attnops.torch import (flash_attn_with_kvcache, npu_fused_infer_attention_score,
                           npu_fused_infer_attention_score_v2, npu_incre_flash_attention,
                           npu_prompt_flash_attention)
from reference import assert_rule

INT32_MAX = 2147483647
CAUSAL = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def attend(q, k, v, scale, visible, dtype):
    """Per batch b: q [N, Sq, D], k/v [KV_N, Skv, D] (GQA by repetition), visible [Sq, Skv] bool.
    float64: the reference; otherwise inputs in `dtype`, fp32 softmax, P rounded to `dtype`
    before P.V (the upstream golden's precision model), output rounded to `dtype`. Rows that see
    nothing are 0. Returns (out [N, Sq, Dv], lse [N, Sq])."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    s = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    if dtype != torch.float64:
        p = p.to(dtype).to(work)
    out = (p @ v.to(work)) / torch.where(l == 0, torch.ones_like(l), l)
    lse = torch.where(l.squeeze(-1) == 0, torch.full_like(l.squeeze(-1), float("inf")),
                      torch.log(l.squeeze(-1)) + m.squeeze(-1))
    return (out if dtype == torch.float64 else out.to(dtype)), lse


def bottom_right(sq, skv, pre=INT32_MAX, nxt=0):
    i = torch.arange(sq).unsqueeze(1) + (skv - sq)
    j = torch.arange(skv).unsqueeze(0)
    return (j <= i + nxt) & (j >= i - pre)


def check(actual, q, k, v, scale, visible, dtype, what):
    ref, _ = attend(q, k, v, scale, visible, torch.float64)
    naive, _ = attend(q, k, v, scale, visible, dtype)
    assert_rule(actual, ref, naive, what)


def randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_prefill_bsh_causal_gqa_with_lse(dtype):
    b, sq, skv, n, kvn, d = 2, 37, 41, 8, 2, 64
    q, k, v = randn(b, sq, n * d, dtype=dtype, seed=1), randn(b, skv, kvn * d, dtype=dtype, seed=2), \
        randn(b, skv, kvn * d, dtype=dtype, seed=3)
    scale = 1 / math.sqrt(d)
    out, lse = npu_fused_infer_attention_score(q, k, v, atten_mask=CAUSAL, num_heads=n, num_key_value_heads=kvn,
                                               scale=scale, input_layout="BSH", sparse_mode=3, softmax_lse_flag=True)
    assert out.shape == (b, sq, n * d) and out.dtype == dtype and lse.shape == (b, n, sq, 1)
    vis = bottom_right(sq, skv)
    for i in range(b):
        qi, ki, vi = (x[i].view(x.shape[1], -1, d).transpose(0, 1) for x in (q, k, v))
        check(out[i].view(sq, n, d).transpose(0, 1), qi, ki, vi, scale, vis, dtype, f"out batch {i}")
        _, want = attend(qi, ki, vi, scale, vis, torch.float64)
        torch.testing.assert_close(lse[i, :, :, 0].double(), want, rtol=0, atol=2e-3)


def test_lse_is_empty_unless_requested():
    q = randn(1, 4, 2, 16, dtype=torch.float16, seed=1)
    out, lse = npu_fused_infer_attention_score(q, q, q, num_heads=4, input_layout="BNSD")
    assert lse.shape == (0,) and out.shape == q.shape


def test_incre_paged_bnsd_cache_with_lengths():
    b, n, kvn, d, bs, blocks = 3, 8, 2, 128, 32, 12
    dtype = torch.bfloat16
    cache_k = randn(blocks, bs, kvn * d, dtype=dtype, seed=4)  # BnBsH
    cache_v = randn(blocks, bs, kvn * d, dtype=dtype, seed=5)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(0)).to(torch.int32)[:b * 4].view(b, 4)
    lens = [100, 1, 64]
    q = randn(b, n, 1, d, dtype=dtype, seed=6)
    out = npu_incre_flash_attention(q, cache_k, cache_v, actual_seq_lengths=lens, block_table=table, block_size=bs,
                                    num_heads=n, num_key_value_heads=kvn, scale_value=0.1, input_layout="BNSD")
    for i in range(b):
        rows = torch.cat([cache_k[int(blk)] for blk in table[i]])[:lens[i]].view(lens[i], kvn, d).transpose(0, 1)
        vals = torch.cat([cache_v[int(blk)] for blk in table[i]])[:lens[i]].view(lens[i], kvn, d).transpose(0, 1)
        check(out[i], q[i], rows, vals, 0.1, torch.ones(1, lens[i], dtype=torch.bool), dtype, f"batch {i}")


def test_incre_rejects_more_than_one_query_token():
    q = randn(1, 2, 64, dtype=torch.float16, seed=1)
    with pytest.raises(ValueError, match="decodes one token"):
        npu_incre_flash_attention(q, q, q, num_heads=1)


def test_prompt_defaults_and_sparse_mode_encoding():
    b, s, n, d = 1, 24, 4, 64
    q, k, v = (randn(b, s, n, d, dtype=torch.float16, seed=i) for i in (7, 8, 9))
    # sparse_mode 13 is torch_npu's "mode 3 at inner_precise 0": the same causal result.
    a = npu_prompt_flash_attention(q, k, v, atten_mask=CAUSAL, sparse_mode=3, num_heads=n, scale_value=0.125,
                                   input_layout="BSND")
    c = npu_prompt_flash_attention(q, k, v, atten_mask=CAUSAL, sparse_mode=13, num_heads=n, scale_value=0.125,
                                   input_layout="BSND")
    assert torch.equal(a, c)
    check(a[0].transpose(0, 1), q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), 0.125,
          bottom_right(s, s), torch.float16, "prompt causal")


def test_v2_names_and_int8_dequantisation():
    b, s, n, d = 2, 50, 4, 64
    q = randn(b, n, 1, d, dtype=torch.float16, seed=10)
    kq = torch.randint(-127, 128, (b, n, s, d), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    vq = torch.randint(-127, 128, (b, n, s, d), generator=torch.Generator().manual_seed(2), dtype=torch.int8)
    ks = (torch.rand(n * d, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.float16)
    vs = (torch.rand(n * d, generator=torch.Generator().manual_seed(4)) * 0.02).to(torch.float16)
    out, lse = npu_fused_infer_attention_score_v2(q, kq, vq, dequant_scale_key=ks, dequant_scale_value=vs,
                                                  num_query_heads=n, softmax_scale=0.125, input_layout="BNSD",
                                                  return_softmax_lse=True)
    assert lse.shape == (b, n, 1, 1)
    k = (kq.to(torch.float32) * ks.float().view(n, 1, d)).to(torch.float16)
    v = (vq.to(torch.float32) * vs.float().view(n, 1, d)).to(torch.float16)
    for i in range(b):
        ref, _ = attend(q[i], kq[i].double() * ks.double().view(n, 1, d), vq[i].double() * vs.double().view(n, 1, d),
                        0.125, torch.ones(1, s, dtype=torch.bool), torch.float64)
        naive, _ = attend(q[i], k[i], v[i], 0.125, torch.ones(1, s, dtype=torch.bool), torch.float16)
        assert_rule(out[i], ref, naive, f"int8 batch {i}")
    with pytest.raises(NotImplementedError, match="out_dtype"):
        npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=n, input_layout="BNSD", out_dtype=1)


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_appends_and_attends(paged):
    b, h, hk, d, new = 2, 8, 2, 64, 3
    dtype = torch.float16
    seqlens = torch.tensor([20, 45], dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    if paged:
        page, blocks = 16, 10
        k_cache = torch.randn(blocks, page, hk, d, generator=g).to(dtype)
        v_cache = torch.randn(blocks, page, hk, d, generator=g).to(dtype)
        table = torch.tensor([[3, 7, 1, 0], [9, 2, 5, 8]], dtype=torch.int32)
    else:
        k_cache = torch.randn(b, 64, hk, d, generator=g).to(dtype)
        v_cache = torch.randn(b, 64, hk, d, generator=g).to(dtype)
        table = None
    k_new, v_new = torch.randn(b, new, hk, d, generator=g).to(dtype), torch.randn(b, new, hk, d, generator=g).to(dtype)
    q = torch.randn(b, new, h, d, generator=g).to(dtype)
    before_k = k_cache.clone()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                       causal=True, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, h, new)
    for i in range(b):
        n_ctx = int(seqlens[i]) + new
        if paged:
            seq_k = torch.cat([k_cache[int(x)] for x in table[i]])[:n_ctx]
            seq_v = torch.cat([v_cache[int(x)] for x in table[i]])[:n_ctx]
            old = torch.cat([before_k[int(x)] for x in table[i]])[:int(seqlens[i])]
        else:
            seq_k, seq_v, old = k_cache[i, :n_ctx], v_cache[i, :n_ctx], before_k[i, :int(seqlens[i])]
        assert torch.equal(seq_k[int(seqlens[i]):], k_new[i]), "new keys appended in place"
        assert torch.equal(seq_k[:int(seqlens[i])], old), "cached keys untouched"
        check(out[i].transpose(0, 1), q[i].transpose(0, 1), seq_k.transpose(0, 1), seq_v.transpose(0, 1),
              1 / math.sqrt(d), bottom_right(new, n_ctx), dtype, f"batch {i}")


def test_flash_attn_with_kvcache_sliding_window_decode():
    b, h, d, s = 2, 4, 64, 40
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(9)
    k_cache, v_cache = torch.randn(b, s, h, d, generator=g).to(dtype), torch.randn(b, s, h, d, generator=g).to(dtype)
    q = torch.randn(b, 1, h, d, generator=g).to(dtype)
    lens = torch.tensor([40, 17], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, causal=True, window_size=(7, 0))
    for i in range(b):
        n_ctx = int(lens[i])
        vis = bottom_right(1, n_ctx, pre=7)
        check(out[i].transpose(0, 1), q[i].transpose(0, 1), k_cache[i, :n_ctx].transpose(0, 1),
              v_cache[i, :n_ctx].transpose(0, 1), 1 / math.sqrt(d), vis, dtype, f"window batch {i}")


def test_bad_input_names_the_argument():
    q = randn(1, 4, 1, 64, dtype=torch.float16, seed=1)
    cache = randn(4, 16, 4 * 64, dtype=torch.float16, seed=2)
    with pytest.raises(ValueError, match=r"blockTable\[0\]\[0\]"):
        npu_fused_infer_attention_score(q, cache, cache, block_table=torch.tensor([[9]], dtype=torch.int32),
                                        block_size=16, actual_seq_lengths_kv=[5], num_heads=4, input_layout="BNSD")
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        flash_attn_with_kvcache(q.transpose(1, 2), cache, cache, rotary_cos=torch.ones(1))


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_bad_append_leaves_the_cache_unchanged(paged):
    """Every slot an append writes is checked before any is written: a negative length or cache
    index or a block_table entry outside the cache is an error naming it, never a write that wraps
    around to another sequence's tokens (torch indexing takes -1 as the last row)."""
    b, h, hk, d = 2, 4, 2, 32
    g = torch.Generator().manual_seed(11)
    q = torch.randn(b, 1, h, d, generator=g).to(torch.bfloat16)
    k_new = torch.randn(b, 1, hk, d, generator=g).to(torch.bfloat16)
    if paged:
        k_cache = torch.randn(6, 16, hk, d, generator=g).to(torch.bfloat16)
        table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
        bad_calls = [
            (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32), block_table=table), r"cache_seqlens\[0\] = -1"),
            (dict(cache_seqlens=torch.tensor([2, 20], dtype=torch.int32), block_table=torch.tensor([[0, 1, 2], [3, -1, 5]],
                                                                                                 dtype=torch.int32)),
             r"block_table\[1\]\[1\] = -1"),
            (dict(cache_seqlens=torch.tensor([2, 40], dtype=torch.int32), block_table=torch.tensor([[0, 1, 2], [3, 4, 6]],
                                                                                                 dtype=torch.int32)),
             r"block_table\[1\]\[2\] = 6"),
        ]
    else:
        k_cache = torch.randn(3, 24, hk, d, generator=g).to(torch.bfloat16)
        bad_calls = [
            (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32), cache_batch_idx=torch.tensor([0, 1])),
             r"cache_seqlens\[0\] = -1"),
            (dict(cache_seqlens=torch.tensor([2, 3], dtype=torch.int32), cache_batch_idx=torch.tensor([0, -1])),
             r"cache_batch_idx\[1\] = -1"),
            (dict(cache_seqlens=torch.tensor([2, 3], dtype=torch.int32), cache_batch_idx=torch.tensor([0, 3])),
             r"cache_batch_idx\[1\] = 3"),
            (dict(cache_seqlens=torch.tensor([2, 3], dtype=torch.int32), cache_batch_idx=torch.tensor([0])),
             r"cache_batch_idx: 1 entries for batch 2"),
        ]
    v_cache = k_cache.clone()
    before = k_cache.clone()
    for kwargs, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new, **kwargs)
        assert torch.equal(k_cache, before) and torch.equal(v_cache, before), f"{message}: the cache was written"
    with pytest.raises(ValueError, match=r"k/v: shape \(2, 1, 2, 16\)"):
        flash_attn_with_kvcache(q, k_cache, v_cache, k_new[..., :16], k_new[..., :16],
                                cache_seqlens=torch.tensor([2, 3], dtype=torch.int32),
                                block_table=table if paged else None)
    assert torch.equal(k_cache, before)
