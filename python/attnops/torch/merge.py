"""Exact merge of partial attention results by their softmax statistics, in fp32: the step that
combines the blocks of ring attention (context parallelism), and the torch_npu-compatible
``npu_ring_attention_update`` MindSpeed's ring attention calls.

Partial results are (out_i, max_i, sum_i): out_i = softmax over one block of keys applied to its
values, max_i the row maximum of the scaled scores, sum_i = sum exp(score - max_i) (torch_npu's
softmax_max / softmax_sum). Merging two blocks gives the attention over the union of their keys:

    m = max(m1, m2);  a = s1 exp(m1 - m);  b = s2 exp(m2 - m);  s = a + b
    out = out1 a / s + out2 b / s

A row that sees no key in a block has max -inf and sum 0; such a block contributes nothing, and a
row empty in both stays empty (out 0, max -inf, sum 0) instead of turning into NaN.

CPU tensors are merged by attnops' AttentionMerge C op (attnops/attention_merge.h: fp32, one
thread per row block, deterministic); tensors elsewhere by the same formula in PyTorch arithmetic
(so the code runs wherever the tensors live: CPU now, a GPU later).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

STAT_LANES = 8


def _merge_op(out1: Tensor, max1: Tensor, sum1: Optional[Tensor], out2: Tensor, max2: Tensor,
              sum2: Optional[Tensor]):
    """The merge by attnops' AttentionMerge op (attnops/attention_merge.h; sums None: the
    log-sum-exp form) when the operands are CPU tensors it takes as they are: out [R..., D] in
    fp32/fp16/bf16, the statistics fp32 [R..., 1]; otherwise None (the caller then uses the
    PyTorch arithmetic below, which is the same formula)."""
    stats = [t for t in (max1, sum1, max2, sum2) if t is not None]
    lead = tuple(out1.shape[:-1])
    if (out1.dim() == 0 or out2.shape != out1.shape or out1.requires_grad or out2.requires_grad
            or any(t.device.type != "cpu" for t in [out1, out2] + stats)
            or any(t.dtype not in (torch.float32, torch.float16, torch.bfloat16) for t in (out1, out2))
            or any(t.dtype != torch.float32 or tuple(t.shape) != lead + (1,) or t.requires_grad for t in stats)):
        return None
    from .. import _C

    out = torch.empty(out1.shape, dtype=torch.float32)
    m = torch.empty(lead + (1,), dtype=torch.float32)
    s = torch.empty(lead + (1,), dtype=torch.float32) if sum1 is not None else None
    _C.attention_merge(out1, max1, sum1, out2, max2, sum2, out, m, s)
    return out, m, s


def merge_max_sum(out1: Tensor, max1: Tensor, sum1: Tensor, out2: Tensor, max2: Tensor,
                  sum2: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Merges two partial results; max/sum broadcast against out (give them a trailing axis of 1
    over the value dimension). Computes in fp32 and returns fp32 (out, max, sum). CPU operands of
    matching shapes go through the AttentionMerge C op; others through PyTorch arithmetic (the
    same formula)."""
    merged = _merge_op(out1, max1, sum1, out2, max2, sum2)
    if merged is not None:
        return merged
    out1, out2 = out1.float(), out2.float()
    m = torch.maximum(max1, max2)
    # Where both blocks are empty (m = -inf), exp(-inf - -inf) would be NaN: shift by 0 instead.
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    a = sum1 * torch.exp(max1 - shift)
    b = sum2 * torch.exp(max2 - shift)
    s = a + b
    live = s > 0
    safe = torch.where(live, s, torch.ones_like(s))
    wa = torch.where(live, a / safe, torch.zeros_like(s))
    wb = torch.where(live, b / safe, torch.zeros_like(s))
    return out1 * wa + out2 * wb, m, s


def merge_lse(out1: Tensor, lse1: Tensor, out2: Tensor, lse2: Tensor) -> Tuple[Tensor, Tensor]:
    """The same merge in log-sum-exp form (flash-attn's statistics): lse = max + log(sum).
    lse broadcasts against out; -inf marks an empty row. Returns fp32 (out, lse)."""
    merged = _merge_op(out1, lse1, None, out2, lse2, None)
    if merged is not None:
        return merged[0], merged[1]
    zero = torch.zeros_like(lse1)
    one1 = torch.where(torch.isneginf(lse1), zero, torch.ones_like(lse1))
    one2 = torch.where(torch.isneginf(lse2), zero, torch.ones_like(lse2))
    out, m, s = merge_max_sum(out1, lse1, one1, out2, lse2, one2)
    return out, torch.where(s > 0, m + torch.log(torch.where(s > 0, s, torch.ones_like(s))), m)


# ---------------------------------------------------------------------------------------------
# TND softmax statistics: the two physical orders.
#
# torch_npu declares TND softmax_max/softmax_sum as [T, N, 8]. Two physical orders exist:
# - "TND" (token-major): element (t, n) at t*N + n. attnops' kernels write this order; torch_npu
#   produces it only when asked (softmax_layout="TND" on npu_fusion_attention,
#   input_softmax_layout="TND" on npu_ring_attention_update, both recent additions).
# - "" (the default, legacy): per sequence i (tokens [t0, t0+s)), a head-major [N, s, 8] block,
#   blocks concatenated. Evidence: MindSpeed's TND ring (utils.py flatten_softmax /
#   unflatten_softmax / get_selection_indices_for_tnd_softmax_update) reads the default output
#   this way, and the default npu_ring_attention_update requires actual_seq_qlen for TND, which
#   only this order needs (the token-major merge is elementwise; torch_npu's own test of the
#   "TND" order checks it against a golden that ignores actual_seq_qlen).


def _tnd_positions(actual_seq_qlen, tokens: int, heads: int, device) -> Tensor:
    """[T, N] index into the flat legacy order of the statistics for each (token, head). Tokens
    past the last cumulative length (a padding tail) form one more block. Tensor arithmetic only
    (no reading of tensor values into Python), so torch.compile can trace it."""
    if actual_seq_qlen is None:
        raise ValueError("actual_seq_qlen: None: required for TND statistics in the per-sequence order")
    if isinstance(actual_seq_qlen, Tensor):
        ends = actual_seq_qlen.to(device=device, dtype=torch.int64).reshape(-1)
    else:
        cum = [int(x) for x in actual_seq_qlen]
        if any(b < a for a, b in zip(cum, cum[1:])) or (cum and (cum[0] < 0 or cum[-1] > tokens)):
            raise ValueError(f"actual_seq_qlen = {cum}: must be non-decreasing cumulative lengths within T = {tokens}")
        ends = torch.tensor(cum, dtype=torch.int64, device=device)
    t = torch.arange(tokens, device=device)
    # A leading 0 (flash-attn style) is an empty first sequence: it changes nothing here.
    seq = torch.searchsorted(ends, t, right=True)
    bounds = torch.cat([ends.new_zeros(1), ends, ends.new_full((1,), tokens)])
    start, end = bounds[seq], bounds[seq + 1]
    n = torch.arange(heads, device=device)
    return start[:, None] * heads + n[None, :] * (end - start)[:, None] + (t - start)[:, None]


def tnd_stats_to_token_major(stats: Tensor, actual_seq_qlen) -> Tensor:
    """Legacy per-sequence [N, s_i, 8] blocks (declared [T, N, 8]) -> token-major [T, N, 8]."""
    t, n, lanes = stats.shape
    pos = _tnd_positions(actual_seq_qlen, t, n, stats.device)
    return stats.reshape(t * n, lanes)[pos.reshape(-1)].reshape(t, n, lanes)


def tnd_stats_from_token_major(stats: Tensor, actual_seq_qlen) -> Tensor:
    """Token-major [T, N, 8] -> legacy per-sequence [N, s_i, 8] blocks, declared [T, N, 8]."""
    t, n, lanes = stats.shape
    pos = _tnd_positions(actual_seq_qlen, t, n, stats.device)
    flat = torch.empty_like(stats).reshape(t * n, lanes)
    flat[pos.reshape(-1)] = stats.reshape(t * n, lanes)
    return flat.reshape(t, n, lanes)


def _check_softmax_layout(name: str, value: str) -> None:
    if value not in ("", "SBH", "TND"):
        raise ValueError(f"{name} = {value!r}: must be '', 'SBH' or 'TND'")


def npu_ring_attention_update(prev_attn_out: Tensor, prev_softmax_max: Tensor, prev_softmax_sum: Tensor,
                              cur_attn_out: Tensor, cur_softmax_max: Tensor, cur_softmax_sum: Tensor,
                              actual_seq_qlen: Optional[Tensor] = None, layout: str = "SBH", *,
                              input_layout: Optional[str] = None,
                              input_softmax_layout: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_ring_attention_update (and MindSpeed's spelling, with a positional
    ``layout``): merges two partial attention results; returns (attn_out in prev_attn_out's dtype,
    softmax_max, softmax_sum), the statistics fp32 with the inputs' shape, 8 equal lanes.

    SBH: attn_out [S, B, H], statistics [B, N, S, 8]. TND: attn_out [T, N, D], statistics declared
    [T, N, 8]; with input_softmax_layout "" or "SBH" in the legacy per-sequence order (needs
    actual_seq_qlen, cumulative, with or without a leading 0), with "TND" token-major. The
    arithmetic is fp32 whatever the input dtype; the result is cast once."""
    layout = input_layout if input_layout is not None else layout
    if layout not in ("SBH", "TND"):
        raise ValueError(f"input_layout = {layout!r}: must be 'SBH' or 'TND'")
    _check_softmax_layout("input_softmax_layout", input_softmax_layout)
    if prev_attn_out.shape != cur_attn_out.shape or prev_attn_out.dtype != cur_attn_out.dtype:
        raise ValueError(f"cur_attn_out: shape {tuple(cur_attn_out.shape)} dtype {cur_attn_out.dtype}: must match "
                         f"prev_attn_out ({tuple(prev_attn_out.shape)}, {prev_attn_out.dtype})")
    stats = (("prev_softmax_max", prev_softmax_max), ("prev_softmax_sum", prev_softmax_sum),
             ("cur_softmax_max", cur_softmax_max), ("cur_softmax_sum", cur_softmax_sum))
    want_rank = 4 if layout == "SBH" else 3
    for name, t in stats:
        if t.dtype != torch.float32:
            raise ValueError(f"{name}: dtype {t.dtype}: must be torch.float32")
        if t.shape != prev_softmax_max.shape or t.dim() != want_rank or t.shape[-1] != STAT_LANES:
            raise ValueError(f"{name}: shape {tuple(t.shape)}: must be {'[B,N,S,8]' if layout == 'SBH' else '[T,N,8]'}"
                             f" and equal to prev_softmax_max's {tuple(prev_softmax_max.shape)}")
    if prev_attn_out.dim() != 3:
        raise ValueError(f"prev_attn_out: rank {prev_attn_out.dim()}: must be 3 ({layout})")

    if layout == "SBH":
        s, b, h = prev_attn_out.shape
        bb, n, ss, _ = prev_softmax_max.shape
        if bb != b or ss != s or n <= 0 or h % n:
            raise ValueError(f"prev_softmax_max: shape {tuple(prev_softmax_max.shape)}: must be [B={b}, N, S={s}, 8] "
                             f"with N dividing H = {h}")

        def rows(x):  # [B,N,S,8] -> [S,B,N,1]
            return x[..., :1].permute(2, 0, 1, 3)

        o1 = prev_attn_out.reshape(s, b, n, h // n)
        o2 = cur_attn_out.reshape(s, b, n, h // n)
        out, m, l = merge_max_sum(o1, rows(prev_softmax_max), rows(prev_softmax_sum), o2, rows(cur_softmax_max),
                                  rows(cur_softmax_sum))
        out = out.reshape(s, b, h)
        m, l = (x.permute(1, 2, 0, 3).expand(b, n, s, STAT_LANES).contiguous() for x in (m, l))
        return out.to(prev_attn_out.dtype), m, l

    t, n, _ = prev_attn_out.shape
    if prev_softmax_max.shape[:2] != (t, n):
        raise ValueError(f"prev_softmax_max: shape {tuple(prev_softmax_max.shape)}: must be [T={t}, N={n}, 8]")
    token_major = input_softmax_layout == "TND"
    if token_major:
        conv = [x for _, x in stats]
    else:
        conv = [tnd_stats_to_token_major(x, actual_seq_qlen) for _, x in stats]
    out, m, l = merge_max_sum(prev_attn_out, conv[0][..., :1], conv[1][..., :1], cur_attn_out, conv[2][..., :1],
                              conv[3][..., :1])
    m, l = (x.expand(t, n, STAT_LANES).contiguous() for x in (m, l))
    if not token_major:
        m, l = (tnd_stats_from_token_major(x, actual_seq_qlen) for x in (m, l))
    return out.to(prev_attn_out.dtype), m, l
