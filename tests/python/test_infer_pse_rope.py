"""pse_shift and MLA (query_rope/key_rope) through torch_npu's npu_fused_infer_attention_score(_v2),
npu_incre_flash_attention and npu_prompt_flash_attention, against a float64 reference written here
under the tolerance rule; decode MLA called as vLLM-Ascend's mla_v1 calls it (value = the key cache)."""

import math

import pytest
import torch

from attnops.torch import (npu_fused_infer_attention_score, npu_fused_infer_attention_score_v2,
                           npu_incre_flash_attention, npu_prompt_flash_attention)
from reference import assert_rule

CAUSAL = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(dtype)


def attend(q, k, v, scale, bias, visible, dtype):
    """Per batch: q [N, Sq, D], k/v [KV_N, Skv, D], bias [N, Sq, Skv] added after the scale, visible
    [Sq, Skv]. float64: the reference; otherwise fp32 softmax with P rounded to `dtype` before P.V."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    s = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale + bias.to(work)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    if dtype != torch.float64:
        p = p.to(dtype).to(work)
    out = (p @ v.to(work)) / torch.where(l == 0, torch.ones_like(l), l)
    return out if dtype == torch.float64 else out.to(dtype)


def check(actual, q, k, v, scale, bias, visible, dtype, what):
    assert_rule(actual, attend(q, k, v, scale, bias, visible, torch.float64),
                attend(q, k, v, scale, bias, visible, dtype), what)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sq", [1, 13])
def test_fused_pse_shift_bnsd(dtype, sq):
    b, skv, n, kvn, d = 2, 45, 4, 2, 32
    q, k, v = randn(b, n, sq, d, dtype=dtype, seed=1), randn(b, kvn, skv, d, dtype=dtype, seed=2), \
        randn(b, kvn, skv, d, dtype=dtype, seed=3)
    pse = randn(1, n, sq, skv + 3, dtype=dtype, seed=4) * 2  # broadcast batch, padded columns
    scale = 1 / math.sqrt(d)
    out, _ = npu_fused_infer_attention_score(q, k, v, pse_shift=pse, num_heads=n, num_key_value_heads=kvn, scale=scale,
                                             input_layout="BNSD")
    vis = torch.ones(sq, skv, dtype=torch.bool)
    for i in range(b):
        check(out[i], q[i], k[i], v[i], scale, pse[0, :, :sq, :skv], vis, dtype, f"batch {i}")


def test_pse_shift_with_causal_prompt_and_incre():
    dtype, b, sq, skv, n, d = torch.bfloat16, 2, 9, 20, 2, 16
    q, k, v = randn(b, sq, n * d, dtype=dtype, seed=5), randn(b, skv, n * d, dtype=dtype, seed=6), \
        randn(b, skv, n * d, dtype=dtype, seed=7)
    pse = randn(b, n, sq, skv, dtype=dtype, seed=8)
    out = npu_prompt_flash_attention(q, k, v, pse_shift=pse, atten_mask=CAUSAL, num_heads=n, scale_value=0.25,
                                     sparse_mode=3)
    i = torch.arange(sq).unsqueeze(1) + (skv - sq)
    vis = torch.arange(skv).unsqueeze(0) <= i
    for bi in range(b):
        qi, ki, vi = (x[bi].view(x.shape[1], n, d).transpose(0, 1) for x in (q, k, v))
        check(out[bi].view(sq, n, d).transpose(0, 1), qi, ki, vi, 0.25, pse[bi], vis, dtype, f"prompt batch {bi}")
    q1 = q[:, :1]
    pse1 = pse[:, :, :1]
    out1 = npu_incre_flash_attention(q1, k, v, pse_shift=pse1, num_heads=n, scale_value=0.25)
    for bi in range(b):
        qi, ki, vi = (x[bi].view(x.shape[1], n, d).transpose(0, 1) for x in (q1, k, v))
        check(out1[bi].view(1, n, d).transpose(0, 1), qi, ki, vi, 0.25, pse1[bi], torch.ones(1, skv, dtype=torch.bool),
              dtype, f"incre batch {bi}")


def paged_mla_cache(lengths, block_size, dim, rope, seed):
    """A BnBsH key cache (blocks, block_size, 512) and key rope cache (blocks, block_size, 64) with
    KV_N 1, blocks handed out in a scrambled order; returns the caches, the block table and the
    logical per-batch keys [S, 512] and ropes [S, 64]."""
    need = [(s + block_size - 1) // block_size for s in lengths]
    blocks = sum(need) + 1
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(seed))
    cache = randn(blocks, block_size, dim, dtype=torch.bfloat16, seed=seed + 1)
    rope_cache = randn(blocks, block_size, rope, dtype=torch.bfloat16, seed=seed + 2)
    table = torch.full((len(lengths), max(need)), -1, dtype=torch.int32)
    keys, ropes, at = [], [], 0
    for b, s in enumerate(lengths):
        ids = order[at:at + need[b]]
        at += need[b]
        table[b, :need[b]] = ids.to(torch.int32)
        keys.append(cache[ids].reshape(-1, dim)[:s])
        ropes.append(rope_cache[ids].reshape(-1, rope)[:s])
    return cache, rope_cache, table, keys, ropes


@pytest.mark.parametrize("v2", [False, True])
def test_decode_mla_like_vllm_ascend(v2):
    """mla_v1: q_nope [B, 1, N, 512] + q_pe [B, 1, N, 64], key = value = the k_nope cache viewed
    (blocks, block_size, 512), key_rope = the k_pe cache, KV_N 1, BSND, paged, softmax_lse."""
    lengths, n, bs = [300, 1, 129], 16, 128
    cache, rope_cache, table, keys, ropes = paged_mla_cache(lengths, bs, 512, 64, seed=10)
    q = randn(len(lengths), 1, n, 512, dtype=torch.bfloat16, seed=20)
    q_pe = randn(len(lengths), 1, n, 64, dtype=torch.bfloat16, seed=21)
    scale = 1 / math.sqrt(512 + 64)
    if v2:
        out, lse = npu_fused_infer_attention_score_v2(
            q, cache, cache, query_rope=q_pe, key_rope=rope_cache, num_query_heads=n, num_key_value_heads=1,
            input_layout="BSND", softmax_scale=scale, block_table=table, block_size=bs, actual_seq_kvlen=lengths,
            return_softmax_lse=True)
    else:
        out, lse = npu_fused_infer_attention_score(
            q, cache, cache, query_rope=q_pe, key_rope=rope_cache, num_heads=n, num_key_value_heads=1,
            input_layout="BSND", scale=scale, block_table=table, block_size=bs, actual_seq_lengths_kv=lengths,
            softmax_lse_flag=True)
    assert out.shape == (len(lengths), 1, n, 512) and lse.shape == (len(lengths), n, 1, 1)
    for b, s in enumerate(lengths):
        qb = torch.cat([q[b, 0], q_pe[b, 0]], -1).unsqueeze(1)  # [N, 1, 576]
        kb = torch.cat([keys[b], ropes[b]], -1).unsqueeze(0)     # [1, S, 576]
        vb = keys[b].unsqueeze(0)                                  # the value is the key
        check(out[b, 0].unsqueeze(1), qb, kb, vb, scale, torch.zeros(n, 1, s), torch.ones(1, s, dtype=torch.bool),
              torch.bfloat16, f"batch {b}")


def test_prefill_mla_tnd():
    """Prefill MLA with separate rope: TND, D 128 + 64, Q_N = KV_N, causal (sparse 3)."""
    qlens, kvlens, n = [3, 8], [10, 8], 2
    tq, tk = sum(qlens), sum(kvlens)
    q, k, v = (randn(t, n, 128, dtype=torch.bfloat16, seed=s) for t, s in ((tq, 30), (tk, 31), (tk, 32)))
    qr, kr = randn(tq, n, 64, dtype=torch.bfloat16, seed=33), randn(tk, n, 64, dtype=torch.bfloat16, seed=34)
    cum = lambda xs: [sum(xs[:i + 1]) for i in range(len(xs))]  # noqa: E731
    out, _ = npu_fused_infer_attention_score(q, k, v, query_rope=qr, key_rope=kr, num_heads=n, num_key_value_heads=n,
                                             input_layout="TND", scale=0.1, atten_mask=CAUSAL, sparse_mode=3,
                                             actual_seq_lengths=cum(qlens), actual_seq_lengths_kv=cum(kvlens))
    q0 = k0 = 0
    for sq, skv in zip(qlens, kvlens):
        qb = torch.cat([q[q0:q0 + sq], qr[q0:q0 + sq]], -1).transpose(0, 1)
        kb = torch.cat([k[k0:k0 + skv], kr[k0:k0 + skv]], -1).transpose(0, 1)
        vb = v[k0:k0 + skv].transpose(0, 1)
        vis = torch.arange(skv).unsqueeze(0) <= torch.arange(sq).unsqueeze(1) + (skv - sq)
        check(out[q0:q0 + sq].transpose(0, 1), qb, kb, vb, 0.1, torch.zeros(n, sq, skv), vis, torch.bfloat16,
              f"sequence at {q0}")
        q0, k0 = q0 + sq, k0 + skv


def test_bad_pse_and_rope_name_the_argument():
    q = randn(1, 2, 1, 32, dtype=torch.float16, seed=1)
    with pytest.raises(ValueError, match="pseShift.dtype"):
        npu_fused_infer_attention_score(q, q, q, pse_shift=torch.zeros(1, 2, 1, 1, dtype=torch.bfloat16), num_heads=2,
                                        input_layout="BNSD")
    with pytest.raises(ValueError, match="pseShift.shape"):
        npu_fused_infer_attention_score(q, q, q, pse_shift=torch.zeros(1, 3, 1, 1, dtype=torch.float16), num_heads=2,
                                        input_layout="BNSD")
    with pytest.raises(ValueError, match="keyRope"):
        npu_fused_infer_attention_score(q, q, q, query_rope=torch.zeros(1, 2, 1, 64, dtype=torch.float16),
                                        num_heads=2, input_layout="BNSD")
