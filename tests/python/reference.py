"""Plain PyTorch maths the attnops operators are checked against: explicit masks, softmax and
matmul, computed either in float64 (the reference) or in the inputs' own precision with fp32
softmax (the "naive" implementation of the tolerance rule in shared/design.md)."""

from __future__ import annotations

import math

import torch

INT32_MAX = 2147483647

# Absolute term of the tolerance rule, relative to the reference's magnitude.
ABS_TOL = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3, torch.float64: 1e-12}


def assert_rule(actual, ref, naive, what=""):
    """The design's tolerance rule: |attnops - ref| <= 2 |naive - ref| + a small absolute term."""
    ref = ref.double()
    err = (actual.double() - ref).abs().max().item() if ref.numel() else 0.0
    base = (naive.double() - ref).abs().max().item() if ref.numel() else 0.0
    bound = 2 * base + ABS_TOL[actual.dtype] * max(1.0, ref.abs().max().item() if ref.numel() else 1.0)
    assert err <= bound, f"{what}: error {err:.3e} > bound {bound:.3e} (naive error {base:.3e})"


def to_bnsd(x, layout, n):
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, n, h // n).transpose(1, 2)
    if layout == "SBH":
        s, b, h = x.shape
        return x.reshape(s, b, n, h // n).permute(1, 2, 0, 3)
    raise ValueError(layout)


def from_bnsd(x, layout):
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    raise ValueError(layout)


def mask_for_mode(mode, sq, sk, pre=INT32_MAX, nxt=INT32_MAX):
    """The atten_mask torch_npu users pass with a mode: the compressed tensor for modes 2-4 and 6-8
    (only its shape is read), an all-False [sq, sk] one for a mode-0 band and mode 5, None where
    nothing is masked. (A None atten_mask means no masking at all, whatever the mode.)"""
    if mode in (2, 3, 4, 7, 8):
        return torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    if mode == 6:
        return torch.zeros(3072, 2048, dtype=torch.bool)
    if mode == 5 or (mode == 0 and (pre != INT32_MAX or nxt != INT32_MAX)):
        return torch.zeros(sq, sk, dtype=torch.bool)
    return None


def mode_mask(mode, sq, sk, pre=INT32_MAX, nxt=INT32_MAX, atten_mask=None, prefix=None):
    """Boolean [sq, sk] (or atten_mask's shape), True = masked, for one sequence (spec §2.6), when
    an atten_mask is given (modes 2-4 and 6-8 compute it from the mode; their tensor is not read)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    if mode == 0:
        m = (j - i > nxt) | (j - i < -pre)
        return m if atten_mask is None else (atten_mask.bool() | m)
    if mode == 1:
        return atten_mask.bool()
    if mode == 2:
        return j > i
    if mode == 3:
        return j > i + (sk - sq)
    if mode == 4:
        d = j - i - (sk - sq)
        return (d > nxt) | (d < -pre)
    if mode in (5, 6):
        return ~((j <= i + (sk - sq)) | (j < prefix))
    raise ValueError(mode)


def attention_math(q, k, v, scale, masked=None, pse=None, pse_type=1, keep=None, keep_prob=1.0, sink=None,
                   dtype=torch.float64):
    """q [B,N1,Sq,D], k [B,N2,Sk,D], v [B,N2,Sk,Dv] -> (out [B,N1,Sq,Dv], max, sum [B,N1,Sq]).
    Fully masked rows give 0 (max -inf, sum 0), as attnops defines them."""
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (t.to(dtype) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    r = (q @ k.transpose(-1, -2)).to(stat)
    if pse is None:
        s = scale * r
    elif pse_type == 1:
        s = scale * (r + pse.to(stat))
    else:
        s = scale * r + pse.to(stat)
    if masked is not None:
        s = s.masked_fill(masked, -math.inf)
    mx = s.amax(-1, keepdim=True)
    if sink is not None:
        mx = torch.maximum(mx, sink.to(stat).view(1, -1, 1, 1))
    safe = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    e = torch.exp(s - safe)
    l = e.sum(-1, keepdim=True)
    if sink is not None:
        l = l + torch.exp(sink.to(stat).view(1, -1, 1, 1) - safe)
    p = e / torch.where(l == 0, torch.ones_like(l), l)
    if keep is not None:
        p = p * keep / keep_prob
    out = p.to(dtype) @ v
    return out, mx.squeeze(-1), l.squeeze(-1)


def unpack_bits(mask, count):
    bits = (mask.to(torch.int64)[:, None] >> torch.arange(8)) & 1
    return bits.flatten()[:count].bool()


def alibi_bias(slopes, sq, sk, q_start=0, kv_start=0, sqrt=False):
    """pse_type 2/3 bias [1|B, N, sq, sk] from slopes [N] or [B, N]."""
    i = torch.arange(sq, dtype=torch.float64)[:, None] + q_start
    j = torch.arange(sk, dtype=torch.float64)[None, :] + kv_start
    dist = (j - i).abs()
    if sqrt:
        dist = dist.sqrt()
    s = slopes.double()
    s = s.view(1, -1, 1, 1) if s.dim() == 1 else s.view(s.shape[0], s.shape[1], 1, 1)
    return -s * dist


def bar_paper(partial_block, block_res, proj_weight, norm_weight, eps=1e-6, dtype=torch.float64):
    """Block Attention Residuals in the paper's PyTorch form (Fig. 2): stack the sources (partial
    block last), RMSNorm them as keys, score against the pseudo-query, softmax over sources, mix the
    raw values. Computed in `dtype` (float64 for the reference, float32 for the naive form)."""
    v = torch.cat([block_res, partial_block[:, None, :]], dim=1).to(dtype)  # [T, N+1, H]
    k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(dtype)
    logits = torch.einsum("h,tnh->tn", proj_weight.reshape(-1).to(dtype), k)
    p = logits.softmax(-1)
    return torch.einsum("tn,tnh->th", p, v)
