"""MLA on the layouts taken since session 8 through torch_npu's npu_fused_infer_attention_score(_v2):
decode MLA with TND_NTD (vLLM-Ascend's mla_v1 call on A3) and the NBSD outputs, prefill MLA (D 128 +
rope 64) with NTD and NTD_TND; each against a float64 reference under the tolerance rule and against
the plain layout's call, element by element."""

import math

import pytest
import torch

from attnops.torch import npu_fused_infer_attention_score, npu_fused_infer_attention_score_v2
from test_infer_pse_rope import CAUSAL, check, paged_mla_cache, randn


def cumulative(xs):
    return [sum(xs[:i + 1]) for i in range(len(xs))]


def test_decode_mla_tnd_ntd_like_vllm_ascend():
    """q_nope [T, N, 512] + q_pe [T, N, 64], 1-3 rows per request (MTP, causal), key = value = the
    k_nope cache, output [N, T, 512]; equals the TND call transposed."""
    lengths, qlens, n, bs = [300, 129, 2], [1, 3, 2], 16, 128
    cache, rope_cache, table, keys, ropes = paged_mla_cache(lengths, bs, 512, 64, seed=40)
    t = sum(qlens)
    q = randn(t, n, 512, dtype=torch.bfloat16, seed=41)
    q_pe = randn(t, n, 64, dtype=torch.bfloat16, seed=42)
    scale = 1 / math.sqrt(512 + 64)

    def call(layout):
        return npu_fused_infer_attention_score_v2(
            q, cache, cache, query_rope=q_pe, key_rope=rope_cache, num_query_heads=n, num_key_value_heads=1,
            input_layout=layout, softmax_scale=scale, sparse_mode=3, atten_mask=CAUSAL, block_table=table,
            block_size=bs, actual_seq_qlen=cumulative(qlens), actual_seq_kvlen=lengths)[0]

    out = call("TND_NTD")
    assert out.shape == (n, t, 512)
    assert torch.equal(out, call("TND").transpose(0, 1))
    q0 = 0
    for b, (sq, s) in enumerate(zip(qlens, lengths)):
        qb = torch.cat([q[q0:q0 + sq], q_pe[q0:q0 + sq]], -1).transpose(0, 1)  # [N, Sq, 576]
        kb = torch.cat([keys[b], ropes[b]], -1).unsqueeze(0)                     # [1, S, 576]
        vis = torch.arange(s).unsqueeze(0) <= torch.arange(sq).unsqueeze(1) + (s - sq)
        check(out[:, q0:q0 + sq], qb, kb, keys[b].unsqueeze(0), scale, torch.zeros(n, sq, s), vis, torch.bfloat16,
              f"request {b}")
        q0 += sq


@pytest.mark.parametrize("base", ["BSH", "BSND", "BNSD"])
def test_decode_mla_nbsd_output_equals_plain(base):
    lengths, n, bs = [70, 1], 8, 64
    cache, rope_cache, table, _, _ = paged_mla_cache(lengths, bs, 512, 64, seed=50)
    shape = {"BSH": (2, 1, n * 512), "BSND": (2, 1, n, 512), "BNSD": (2, n, 1, 512)}[base]
    q = randn(*shape, dtype=torch.bfloat16, seed=51)
    q_pe = randn(*shape[:-1], shape[-1] // 8, dtype=torch.bfloat16, seed=52)

    def call(layout):
        return npu_fused_infer_attention_score(
            q, cache, cache, query_rope=q_pe, key_rope=rope_cache, num_heads=n, num_key_value_heads=1,
            input_layout=layout, scale=0.05, block_table=table, block_size=bs, actual_seq_lengths_kv=lengths,
            softmax_lse_flag=True)

    nbsd, lse = call(base + "_NBSD")
    plain, plain_lse = call(base)
    assert nbsd.shape == (n, 2, 1, 512)
    as_bnsd = {"BSH": plain.view(2, 1, n, 512).transpose(1, 2), "BSND": plain.transpose(1, 2), "BNSD": plain}[base]
    assert torch.equal(nbsd, as_bnsd.transpose(0, 1))
    assert torch.equal(lse, plain_lse)


def test_prefill_mla_ntd_and_ntd_tnd():
    """Prefill MLA with separate rope in NTD (heads outer): D 128 + 64, Q_N = KV_N, causal."""
    qlens, kvlens, n = [3, 0, 8], [10, 4, 8], 2
    tq, tk = sum(qlens), sum(kvlens)
    q, k, v = (randn(n, t, 128, dtype=torch.bfloat16, seed=s) for t, s in ((tq, 60), (tk, 61), (tk, 62)))
    qr, kr = randn(n, tq, 64, dtype=torch.bfloat16, seed=63), randn(n, tk, 64, dtype=torch.bfloat16, seed=64)

    def call(layout):
        return npu_fused_infer_attention_score(
            q, k, v, query_rope=qr, key_rope=kr, num_heads=n, num_key_value_heads=n, input_layout=layout, scale=0.1,
            atten_mask=CAUSAL, sparse_mode=3, actual_seq_lengths=cumulative(qlens),
            actual_seq_lengths_kv=cumulative(kvlens), softmax_lse_flag=True)

    out, lse = call("NTD")
    assert out.shape == (n, tq, 128) and lse.shape == (tq, n, 1)
    out_tnd, lse_tnd = call("NTD_TND")
    assert torch.equal(out_tnd, out.transpose(0, 1)) and torch.equal(lse_tnd, lse)
    q0 = k0 = 0
    for sq, skv in zip(qlens, kvlens):
        if sq > 0:
            qb = torch.cat([q[:, q0:q0 + sq], qr[:, q0:q0 + sq]], -1)
            kb = torch.cat([k[:, k0:k0 + skv], kr[:, k0:k0 + skv]], -1)
            vis = torch.arange(skv).unsqueeze(0) <= torch.arange(sq).unsqueeze(1) + (skv - sq)
            check(out[:, q0:q0 + sq], qb, kb, v[:, k0:k0 + skv], 0.1, torch.zeros(n, sq, skv), vis, torch.bfloat16,
                  f"sequence at {q0}")
        q0, k0 = q0 + sq, k0 + skv


def test_mla_layouts_refused_name_the_rule():
    cache, rope_cache, table, _, _ = paged_mla_cache([30], 16, 512, 64, seed=70)
    q = randn(8, 1, 512, dtype=torch.bfloat16, seed=71)  # NTD: decode MLA does not take it
    with pytest.raises(ValueError, match="MLA with D 512 takes"):
        npu_fused_infer_attention_score(q, cache, cache, query_rope=randn(8, 1, 64, dtype=torch.bfloat16, seed=72),
                                        key_rope=rope_cache, num_heads=8, num_key_value_heads=1, input_layout="NTD",
                                        block_table=table, block_size=16, actual_seq_lengths=[1],
                                        actual_seq_lengths_kv=[30])
