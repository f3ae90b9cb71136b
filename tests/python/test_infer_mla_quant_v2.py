"""MLA full quantisation and the output quantisation through npu_fused_infer_attention_score_v2
(spec 9.2 "MLA full quant", 9.3, 13.2): an int8 query with dequant_scale_query (per token and head,
query_quant_mode 3), an int8 paged key/value cache with per-tensor dequant_scale_key/value, bf16 rope
parts, bf16 output; quant_scale_out / quant_offset_out giving an int8 output. Checked against float64
maths written here; the fake implementation (torch.compile, meta) gives the real op's dtype and
shape; missing operands are clear errors naming them."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from attnops.torch import npu_fused_infer_attention_score_v2

N, D, R, BS = 8, 512, 64, 128
SCALE = 1 / math.sqrt(D + R)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def mla_quant_inputs(lengths, rows=1, seed=0):
    """BSND int8 query [B, rows, N, 512] with its scales [B, rows, N], bf16 query rope, an int8
    BnBsH cache [blocks, 128, 512] with a bf16 rope cache, a shuffled block table."""
    b = len(lengths)
    per = [max(1, -(-s // BS)) for s in lengths]
    blocks = sum(per) + 1
    order = torch.randperm(blocks, generator=gen(seed))
    table = torch.full((b, max(per)), -1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(per):
        table[i, :n] = order[at:at + n].to(torch.int32)
        at += n
    q = torch.randint(-100, 101, (b, rows, N, D), generator=gen(seed + 1), dtype=torch.int8)
    dq = 0.004 + 0.008 * torch.rand(b, rows, N, generator=gen(seed + 2))
    q_pe = torch.randn(b, rows, N, R, generator=gen(seed + 3)).to(torch.bfloat16)
    cache = torch.randint(-100, 101, (blocks, BS, D), generator=gen(seed + 4), dtype=torch.int8)
    rope_cache = torch.randn(blocks, BS, R, generator=gen(seed + 5)).to(torch.bfloat16)
    sk, sv = torch.tensor([0.007]), torch.tensor([0.009])
    return q, dq, q_pe, cache, rope_cache, table, sk, sv


def expected(q, dq, q_pe, cache, rope_cache, table, sk, sv, lengths, causal=False):
    """[B, rows, N, 512] float64: dequantise the query per token and head and the cache per tensor,
    rope unscaled, softmax(scale * (q.k + q_pe.k_pe)) . (k * sv)."""
    b, rows = q.shape[0], q.shape[1]
    out = torch.zeros(b, rows, N, D, dtype=torch.float64)
    for i, s in enumerate(lengths):
        ids = table[i, :max(1, -(-s // BS))].long()
        k = cache[ids].reshape(-1, D)[:s].to(torch.float64)
        kr = rope_cache[ids].reshape(-1, R)[:s].to(torch.float64)
        for r in range(rows):
            qf = q[i, r].to(torch.float64) * dq[i, r].to(torch.float64).unsqueeze(-1)        # [N, 512]
            sc = SCALE * (qf @ k.T * sk.item() + q_pe[i, r].to(torch.float64) @ kr.T)       # [N, s]
            if causal:
                if s - rows + r + 1 <= 0:
                    continue  # a row that attends nothing is 0 (spec A)
                sc[:, s - rows + r + 1:] = float("-inf")
            out[i, r] = torch.softmax(sc, -1) @ (k * sv.item())
    return out


def call(q, dq, q_pe, cache, rope_cache, table, sk, sv, lengths, **kw):
    return npu_fused_infer_attention_score_v2(
        q, cache, cache, query_rope=q_pe, key_rope=rope_cache, dequant_scale_query=dq, dequant_scale_key=sk,
        dequant_scale_value=sv, query_quant_mode=3, num_query_heads=N, num_key_value_heads=1, input_layout="BSND",
        softmax_scale=SCALE, block_table=table, block_size=BS, actual_seq_kvlen=lengths, **kw)


@pytest.mark.parametrize("rows", [1, 3])
def test_mla_full_quant_matches_float64(rows):
    lengths = [300, 1, 129]
    args = mla_quant_inputs(lengths, rows, seed=rows)
    causal = rows > 1
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1) if causal else None
    out, lse = call(*args, lengths, atten_mask=mask, sparse_mode=3 if causal else 0, return_softmax_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (3, rows, N, D) and lse.shape == (3, N, rows, 1)
    want = expected(*args, lengths, causal=causal)
    err = (out.to(torch.float64) - want).abs().max().item()
    assert err <= 0.02 * want.abs().max().item(), err  # bf16 probabilities and output


def test_query_scales_are_per_token_and_head():
    """Doubling one (token, head) scale changes that head's row only."""
    lengths = [200, 50]
    q, dq, q_pe, cache, rope_cache, table, sk, sv = mla_quant_inputs(lengths, seed=7)
    a, _ = call(q, dq, q_pe, cache, rope_cache, table, sk, sv, lengths)
    dq2 = dq.clone()
    dq2[1, 0, 3] *= 2
    b, _ = call(q, dq2, q_pe, cache, rope_cache, table, sk, sv, lengths)
    changed = (a != b).any(-1)  # [B, 1, N]
    assert changed[1, 0, 3] and changed.sum() == 1


def test_fake_impl_gives_dtype_and_shape():
    lengths = [130, 5]
    args = mla_quant_inputs(lengths, seed=3)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in args]
        out, lse = call(*fake, lengths)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 1, N, D) and tuple(lse.shape) == (0,)


def test_quant_out_and_offset_give_int8():
    """quant_scale_out / quant_offset_out (quantScale2 / quantOffset2) on a bf16 call: int8 output
    clamp(round_half_even(O * s + o))."""
    g = gen(11)
    q = torch.randn(2, 4, 2, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(2, 30, 2, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(2, 30, 2, 64, generator=g).to(torch.bfloat16)
    s, o = torch.tensor([150.0]), torch.tensor([3.0])
    plain, _ = npu_fused_infer_attention_score_v2(q, k, v, num_query_heads=2, input_layout="BSND", softmax_scale=0.125)
    out8, _ = npu_fused_infer_attention_score_v2(q, k, v, num_query_heads=2, input_layout="BSND", softmax_scale=0.125,
                                                 quant_scale_out=s, quant_offset_out=o)
    assert out8.dtype == torch.int8
    # Within one step of the bf16 result quantised (the fp32 result may round across it).
    assert (out8.to(torch.float64) - torch.round(plain.to(torch.float64) * 150 + 3).clamp(-128, 127)).abs().max() <= 2


def test_missing_or_wrong_operands_name_the_argument():
    lengths = [64]
    q, dq, q_pe, cache, rope_cache, table, sk, sv = mla_quant_inputs(lengths, seed=5)
    with pytest.raises(Exception, match="dequantScaleQuery"):
        call(q, None, q_pe, cache, rope_cache, table, sk, sv, lengths)
    with pytest.raises(Exception, match="valueAntiquantScale"):
        call(q, dq, q_pe, cache, rope_cache, table, sk, None, lengths)
    with pytest.raises(Exception, match="dequantScaleQuery.shape"):
        call(q, dq[:, :, :4], q_pe, cache, rope_cache, table, sk, sv, lengths)
    with pytest.raises(Exception, match="queryQuantMode"):
        npu_fused_infer_attention_score_v2(
            q, cache, cache, query_rope=q_pe, key_rope=rope_cache, dequant_scale_query=dq, dequant_scale_key=sk,
            dequant_scale_value=sv, query_quant_mode=0, num_query_heads=N, num_key_value_heads=1,
            input_layout="BSND", softmax_scale=SCALE, block_table=table, block_size=BS, actual_seq_kvlen=lengths)
