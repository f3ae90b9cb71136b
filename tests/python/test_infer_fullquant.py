"""Full int8 quantisation through the torch_npu entry points (spec 9.2, 13.1, 13.4): int8 query, key
and value with deq_scale1 / quant_scale1 / deq_scale2 (fp32, or uint64 holding the fp32 bits in the
low half) through npu_prompt_flash_attention and npu_fused_infer_attention_score, fp16 or int8
output, against the rounding steps of 9.2 written here in float64 (fp16 scores, int8
probabilities)."""

import math

import pytest
import torch

from attnops.torch import npu_fused_infer_attention_score, npu_prompt_flash_attention

B, SQ, SKV, N, D = 2, 8, 40, 2, 32
SCALE = 1.0 / math.sqrt(D)
DEQ1, QS1, DEQ2 = 0.0004, 127.0, 0.01 / 127.0


def gen(seed):
    return torch.Generator().manual_seed(seed)


def float19(x):
    bits = torch.tensor([x], dtype=torch.float32).view(torch.int32) & -8192  # low 13 mantissa bits cleared
    return bits.view(torch.float32).item()


def expected(q, k, v, causal=False):
    """[B, N, SQ, D] float64 from int8 BNSD q/k/v: the steps of spec 9.2 (one block of keys)."""
    dot = q.to(torch.float64) @ k.to(torch.float64).transpose(-1, -2)  # exact integers
    s = (dot.to(torch.float32) * float19(DEQ1)).clamp(-65504, 65504).to(torch.float16)
    s = (s.to(torch.float32) * torch.tensor(SCALE, dtype=torch.float16).to(torch.float32)).to(torch.float16).to(torch.float32)
    if causal:
        s = s.masked_fill(torch.ones(SQ, SKV, dtype=torch.bool).triu(1 + SKV - SQ), float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    p8 = torch.round(e * QS1).clamp(-128, 127).to(torch.float64)
    return (p8 @ v.to(torch.float64)) * DEQ2 / e.to(torch.float64).sum(-1, keepdim=True)


def inputs():
    return tuple(torch.randint(-100, 101, shape, generator=gen(i), dtype=torch.int8)
                 for i, shape in enumerate([(B, N, SQ, D), (B, N, SKV, D), (B, N, SKV, D)]))


def scales():
    return (torch.tensor([DEQ1], dtype=torch.float32), torch.tensor([QS1], dtype=torch.float32),
            torch.tensor([DEQ2], dtype=torch.float32))


def test_prompt_flash_attention_fp16_output():
    q, k, v = inputs()
    d1, q1, d2 = scales()
    out = npu_prompt_flash_attention(q, k, v, deq_scale1=d1, quant_scale1=q1, deq_scale2=d2, num_heads=N,
                                     scale_value=SCALE, input_layout="BNSD", next_tokens=2147483647)
    assert out.dtype == torch.float16 and out.shape == (B, N, SQ, D)
    want = expected(q, k, v)
    torch.testing.assert_close(out.to(torch.float64), want, atol=1e-4, rtol=2e-3)


def test_fused_causal_and_int8_output():
    q, k, v = inputs()
    d1, q1, d2 = scales()
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    out, _ = npu_fused_infer_attention_score(q, k, v, atten_mask=mask, dequant_scale1=d1, quant_scale1=q1,
                                             dequant_scale2=d2, num_heads=N, scale=SCALE, input_layout="BNSD",
                                             sparse_mode=3)
    want = expected(q, k, v, causal=True)
    torch.testing.assert_close(out.to(torch.float64), want, atol=1e-4, rtol=2e-3)
    qs2 = torch.tensor([300.0])
    out8, _ = npu_fused_infer_attention_score(q, k, v, atten_mask=mask, dequant_scale1=d1, quant_scale1=q1,
                                              dequant_scale2=d2, quant_scale2=qs2, num_heads=N, scale=SCALE,
                                              input_layout="BNSD", sparse_mode=3)
    assert out8.dtype == torch.int8
    # Within one step of the quantised exact result (the fp32 result may sit on the other side of a tie).
    assert (out8.to(torch.float64) - torch.round(want * 300).clamp(-128, 127)).abs().max() <= 1


@pytest.mark.skipif(not hasattr(torch, "uint64"), reason="this torch has no uint64")
def test_uint64_scales_equal_their_float19_values():
    q, k, v = inputs()
    d1, q1, d2 = scales()
    as_u64 = [torch.tensor([int(torch.tensor([float19(x)]).view(torch.int32).item()) & 0xffffffff], dtype=torch.int64)
              .to(torch.uint64) for x in (DEQ1, DEQ2)]
    a = npu_prompt_flash_attention(q, k, v, deq_scale1=as_u64[0], quant_scale1=q1, deq_scale2=as_u64[1], num_heads=N,
                                   scale_value=SCALE, input_layout="BNSD", next_tokens=2147483647)
    b = npu_prompt_flash_attention(q, k, v, deq_scale1=d1, quant_scale1=q1,
                                   deq_scale2=torch.tensor([float19(DEQ2)]), num_heads=N, scale_value=SCALE,
                                   input_layout="BNSD", next_tokens=2147483647)
    assert torch.equal(a, b)


def test_missing_scale_is_a_clear_error():
    q, k, v = inputs()
    d1, q1, _ = scales()
    with pytest.raises(Exception, match="deqScale2"):
        npu_prompt_flash_attention(q, k, v, deq_scale1=d1, quant_scale1=q1, num_heads=N, scale_value=SCALE,
                                   input_layout="BNSD")
