"""Quantisation through the torch_npu entry points (spec 9.1, 9.3, 13): the combined
antiquant_scale/antiquant_offset style of npu_fused_infer_attention_score and
npu_incre_flash_attention, per-token x per-head scales (v2 dequant_scale_key, mode 3), int4 key/value
in int32 containers, and the int8 output of quant_scale2 / quant_scale_out, against float64 maths
written here."""

import pytest
import torch

from attnops.torch import (npu_fused_infer_attention_score, npu_fused_infer_attention_score_v2,
                           npu_incre_flash_attention)
from reference import assert_rule

B, S, N, KVN, D = 2, 50, 4, 2, 64
SCALE = 0.125


def gen(seed):
    return torch.Generator().manual_seed(seed)


def attend(q, k, v, dtype):
    """q [B, N, 1, D], k/v [B, KV_N, S, D] float; float64 reference, or fp32 softmax with P rounded
    to `dtype` (the naive twin of the tolerance rule). Returns [B, N, 1, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    s = (q.to(work) @ k.to(work).transpose(-1, -2)) * SCALE
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l = p.sum(-1, keepdim=True)
    if dtype != torch.float64:
        p = p.to(dtype).to(work)
    out = (p @ v.to(work)) / l
    return out if dtype == torch.float64 else out.to(dtype)


def check(out, q, kq, vq, kscale, kofs, vscale, vofs, what):
    """kscale etc. broadcast against [B, KV_N, S, D]."""
    def deq(x, s, o, t):
        return ((x.to(t) + o.to(t)) * s.to(t))
    ref = attend(q, deq(kq, kscale, kofs, torch.float64), deq(vq, vscale, vofs, torch.float64), torch.float64)
    naive = attend(q, deq(kq, kscale, kofs, torch.float32).to(q.dtype), deq(vq, vscale, vofs, torch.float32).to(q.dtype),
                   q.dtype)
    assert_rule(out, ref, naive, what)
    return ref


def int8_kv():
    return (torch.randint(-127, 128, (B, KVN, S, D), generator=gen(1), dtype=torch.int8),
            torch.randint(-127, 128, (B, KVN, S, D), generator=gen(2), dtype=torch.int8))


def test_combined_per_channel_and_per_token():
    q = torch.randn(B, N, 1, D, generator=gen(3)).to(torch.float16)
    kq, vq = int8_kv()
    # per channel: [2, KV_N, 1, D] in the query dtype, offset of the same shape
    sc = (torch.rand(2, KVN, 1, D, generator=gen(4)) * 0.02 + 0.002).to(torch.float16)
    of = torch.randint(-4, 5, (2, KVN, 1, D), generator=gen(5)).to(torch.float16)
    out, _ = npu_fused_infer_attention_score(q, kq, vq, antiquant_scale=sc, antiquant_offset=of, num_heads=N,
                                             num_key_value_heads=KVN, scale=SCALE, input_layout="BNSD")
    check(out, q, kq, vq, sc[0].view(1, KVN, 1, D), of[0].view(1, KVN, 1, D), sc[1].view(1, KVN, 1, D),
          of[1].view(1, KVN, 1, D), "combined per-channel")
    # the same through IncreFlashAttention's names
    ifa = npu_incre_flash_attention(q, kq, vq, antiquant_scale=sc, antiquant_offset=of, num_heads=N,
                                    num_key_value_heads=KVN, scale_value=SCALE, input_layout="BNSD")
    assert torch.equal(ifa, out)
    # per token: [2, B, S] fp32, antiquant_mode 1
    st = torch.rand(2, B, S, generator=gen(6)) * 0.02 + 0.002
    out, _ = npu_fused_infer_attention_score(q, kq, vq, antiquant_scale=st, antiquant_mode=1, num_heads=N,
                                             num_key_value_heads=KVN, scale=SCALE, input_layout="BNSD")
    zero = torch.zeros(1)
    check(out, q, kq, vq, st[0].view(B, 1, S, 1), zero, st[1].view(B, 1, S, 1), zero, "combined per-token")


def test_v2_per_token_per_head_and_int8_output():
    q = torch.randn(B, N, 1, D, generator=gen(7)).to(torch.bfloat16)
    kq, vq = int8_kv()
    ks, vs = (torch.rand(B, KVN, S, generator=gen(s)) * 0.02 + 0.002 for s in (8, 9))
    out, _ = npu_fused_infer_attention_score_v2(q, kq, vq, dequant_scale_key=ks, dequant_scale_value=vs,
                                                key_quant_mode=3, value_quant_mode=3, num_query_heads=N,
                                                num_key_value_heads=KVN, softmax_scale=SCALE, input_layout="BNSD")
    zero = torch.zeros(1)
    ref = check(out, q, kq, vq, ks.view(B, KVN, S, 1), zero, vs.view(B, KVN, S, 1), zero, "mode 3")
    # int8 output, per channel [N, D] bf16 scale and offset
    qs = (torch.rand(N, D, generator=gen(10)) * 200 + 100).to(torch.bfloat16)
    qo = torch.randint(-3, 4, (N, D), generator=gen(11)).to(torch.bfloat16)
    o8, _ = npu_fused_infer_attention_score_v2(q, kq, vq, dequant_scale_key=ks, dequant_scale_value=vs,
                                               key_quant_mode=3, value_quant_mode=3, quant_scale_out=qs,
                                               quant_offset_out=qo, num_query_heads=N, num_key_value_heads=KVN,
                                               softmax_scale=SCALE, input_layout="BNSD")
    assert o8.dtype == torch.int8 and o8.shape == out.shape
    exact = torch.clamp(torch.round(ref * qs.double().view(1, N, 1, D) + qo.double().view(1, N, 1, D)), -128, 127)
    assert (o8.double() - exact).abs().max().item() <= 1  # the rounding of a result within the tolerance
    assert (o8.double() == exact).double().mean().item() > 0.9


def test_int4_in_int32_containers():
    q = torch.randn(B, 1, N * D, generator=gen(12)).to(torch.float16)  # BSH
    k4 = torch.randint(-8, 8, (B, S, KVN * D), generator=gen(13))
    v4 = torch.randint(-8, 8, (B, S, KVN * D), generator=gen(14))

    def pack(x):  # eight nibbles per int32, low nibble first
        nib = (x & 0xF).view(*x.shape[:-1], -1, 8)
        word = sum(nib[..., i] << (4 * i) for i in range(8))
        return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)

    ks = (torch.rand(KVN * D, generator=gen(15)) * 0.1 + 0.02).to(torch.float16)
    vs = (torch.rand(KVN * D, generator=gen(16)) * 0.1 + 0.02).to(torch.float16)
    out, _ = npu_fused_infer_attention_score(q, pack(k4), pack(v4), key_antiquant_scale=ks, value_antiquant_scale=vs,
                                             num_heads=N, num_key_value_heads=KVN, scale=SCALE, input_layout="BSH")
    assert out.shape == (B, 1, N * D) and out.dtype == torch.float16

    def bnsd(x):
        return x.view(B, S, KVN, D).transpose(1, 2)
    zero = torch.zeros(1)
    qb = q.view(B, 1, N, D).transpose(1, 2)
    check(out.view(B, 1, N, D).transpose(1, 2), qb, bnsd(k4), bnsd(v4), ks.view(1, KVN, 1, D), zero,
          vs.view(1, KVN, 1, D), zero, "int4")


def test_bad_quant_arguments_name_the_argument():
    q = torch.randn(B, N, 1, D, generator=gen(3)).to(torch.float16)
    kq, vq = int8_kv()
    with pytest.raises(Exception, match="antiquantScale.shape"):
        npu_fused_infer_attention_score(q, kq, vq, antiquant_scale=torch.ones(3, dtype=torch.float16), num_heads=N,
                                        num_key_value_heads=KVN, input_layout="BNSD")
    with pytest.raises(Exception, match="quantScale2.shape"):
        npu_fused_infer_attention_score(q, q, q, quant_scale2=torch.ones(5), num_heads=N, input_layout="BNSD")
