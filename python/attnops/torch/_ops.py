"""The attnops operators as PyTorch operators (torch.library): attnops::flash_attention_score,
attnops::flash_attention_score_grad, attnops::block_attention_residuals and
attnops::block_attention_residuals_backward, each with a fake (meta) implementation for
torch.compile and, for the two forwards, autograd formulas that call the grads.

Outputs are allocated here (contiguous) and the library fills them in place; inputs reach the
library as they are, strides included. Sequence-length arrays are 1-D int32/int64 CPU tensors, so
a compiled graph never has to turn tensor data into Python values.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .. import _C

INT32_MAX = 2147483647
# softmax_max / softmax_sum carry each row's value in 8 lanes (torch_npu layout).
STAT_LANES = 8


def _fa_shapes(query: Tensor, key: Tensor, value: Tensor, head_num: int, layout: str):
    """(attention_out shape, softmax statistics shape) for a layout; no validation beyond what
    is needed to compute them (the library checks everything and names the culprit)."""
    ranks = {"BSH": 3, "SBH": 3, "BSND": 4, "BNSD": 4, "TND": 3}
    if layout not in ranks:
        raise ValueError(f"input_layout = {layout!r}: must be one of BSH, SBH, BSND, BNSD, TND")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != ranks[layout]:
            raise ValueError(f"{name}: rank {t.dim()} for input_layout {layout}: must be {ranks[layout]}")
    if layout in ("BSH", "SBH"):
        d = query.shape[2] // head_num if head_num > 0 else 0
        n2 = key.shape[2] // d if d > 0 else 0
        dv = value.shape[2] // n2 if n2 > 0 else 0
        if layout == "BSH":
            b, s1 = query.shape[0], query.shape[1]
            out = (b, s1, head_num * dv)
        else:
            s1, b = query.shape[0], query.shape[1]
            out = (s1, b, head_num * dv)
        return out, (b, head_num, s1, STAT_LANES)
    dv = value.shape[-1]
    if layout == "TND":
        t1, n1 = query.shape[0], query.shape[1]
        return (t1, n1, dv), (t1, n1, STAT_LANES)
    if layout == "BSND":
        b, s1, n1 = query.shape[0], query.shape[1], query.shape[2]
        return (b, s1, n1, dv), (b, n1, s1, STAT_LANES)
    b, n1, s1 = query.shape[0], query.shape[1], query.shape[2]
    return (b, n1, s1, dv), (b, n1, s1, STAT_LANES)


def _cpu(name: str, t: Optional[Tensor]) -> None:
    if t is not None and t.device.type != "cpu":
        raise ValueError(f"{name}: device {t.device}: attnops runs on CPU tensors")


def _plain(t: Optional[Tensor]) -> Optional[Tensor]:
    """The tensor as DLPack exports it (no autograd history: the formulas are registered here)."""
    return None if t is None else t.detach()


# ---------------------------------------------------------------------------------------------
# FlashAttentionScore


@torch.library.custom_op("attnops::flash_attention_score", mutates_args=())
def flash_attention_score(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    pse: Optional[Tensor],
    drop_mask: Optional[Tensor],
    atten_mask: Optional[Tensor],
    actual_seq_qlen: Optional[Tensor],
    actual_seq_kvlen: Optional[Tensor],
    sink: Optional[Tensor],
    prefix: Optional[List[int]],
    q_start_idx: Optional[List[int]],
    kv_start_idx: Optional[List[int]],
    scale: float,
    keep_prob: float,
    pre_tokens: int,
    next_tokens: int,
    head_num: int,
    input_layout: str,
    inner_precise: int,
    sparse_mode: int,
    pse_type: int,
    seed: int,
    offset: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """FlashAttentionScore: (attention_out, softmax_max, softmax_sum). Arguments as in the C API
    (include/attnops/flash_attention_score.h); actual_seq_* are cumulative, without a leading 0."""
    for name, t in (("query", query), ("key", key), ("value", value), ("pse", pse), ("atten_mask", atten_mask)):
        _cpu(name, t)
    out_shape, stat_shape = _fa_shapes(query, key, value, head_num, input_layout)
    out = query.new_empty(out_shape)
    smax = query.new_empty(stat_shape, dtype=torch.float32)
    ssum = query.new_empty(stat_shape, dtype=torch.float32)
    _C.flash_attention_score(
        _plain(query), _plain(key), _plain(value), _plain(pse), drop_mask, atten_mask, prefix,
        actual_seq_qlen, actual_seq_kvlen, q_start_idx, kv_start_idx, _plain(sink), scale, keep_prob,
        pre_tokens, next_tokens, head_num, input_layout, inner_precise, sparse_mode, pse_type, seed,
        offset, out, smax, ssum)
    return out, smax, ssum


@flash_attention_score.register_fake
def _(query, key, value, pse, drop_mask, atten_mask, actual_seq_qlen, actual_seq_kvlen, sink, prefix,
      q_start_idx, kv_start_idx, scale, keep_prob, pre_tokens, next_tokens, head_num, input_layout,
      inner_precise, sparse_mode, pse_type, seed, offset):
    out_shape, stat_shape = _fa_shapes(query, key, value, head_num, input_layout)
    return (query.new_empty(out_shape), query.new_empty(stat_shape, dtype=torch.float32),
            query.new_empty(stat_shape, dtype=torch.float32))


@torch.library.custom_op("attnops::flash_attention_score_grad", mutates_args=())
def flash_attention_score_grad(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dy: Tensor,
    pse: Optional[Tensor],
    drop_mask: Optional[Tensor],
    atten_mask: Optional[Tensor],
    softmax_max: Tensor,
    softmax_sum: Tensor,
    attention_in: Tensor,
    actual_seq_qlen: Optional[Tensor],
    actual_seq_kvlen: Optional[Tensor],
    sink: Optional[Tensor],
    prefix: Optional[List[int]],
    q_start_idx: Optional[List[int]],
    kv_start_idx: Optional[List[int]],
    scale: float,
    keep_prob: float,
    pre_tokens: int,
    next_tokens: int,
    head_num: int,
    input_layout: str,
    inner_precise: int,
    sparse_mode: int,
    pse_type: int,
    seed: int,
    offset: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """FlashAttentionScoreGrad: (dq, dk, dv, dsink); dsink is empty when sink is None."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (query, key, value))
    dsink = torch.empty((sink.shape[0],) if sink is not None else (0,), dtype=torch.float32)
    _C.flash_attention_score_grad(
        _plain(query), _plain(key), _plain(value), _plain(dy), _plain(pse), drop_mask, atten_mask,
        _plain(softmax_max), _plain(softmax_sum), _plain(attention_in), prefix, actual_seq_qlen,
        actual_seq_kvlen, q_start_idx, kv_start_idx, _plain(sink), scale, keep_prob, pre_tokens,
        next_tokens, head_num, input_layout, inner_precise, sparse_mode, pse_type, seed, offset, dq, dk,
        dv, dsink if sink is not None else None)
    return dq, dk, dv, dsink


@flash_attention_score_grad.register_fake
def _(query, key, value, dy, pse, drop_mask, atten_mask, softmax_max, softmax_sum, attention_in,
      actual_seq_qlen, actual_seq_kvlen, sink, prefix, q_start_idx, kv_start_idx, scale, keep_prob,
      pre_tokens, next_tokens, head_num, input_layout, inner_precise, sparse_mode, pse_type, seed, offset):
    dsink = query.new_empty((sink.shape[0],) if sink is not None else (0,), dtype=torch.float32)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dsink


# Position of each argument of attnops::flash_attention_score, for the autograd formula.
_FA_ARGS = ("query", "key", "value", "pse", "drop_mask", "atten_mask", "actual_seq_qlen",
            "actual_seq_kvlen", "sink", "prefix", "q_start_idx", "kv_start_idx", "scale", "keep_prob",
            "pre_tokens", "next_tokens", "head_num", "input_layout", "inner_precise", "sparse_mode",
            "pse_type", "seed", "offset")
_FA_TENSORS = ("query", "key", "value", "pse", "drop_mask", "atten_mask", "actual_seq_qlen",
               "actual_seq_kvlen", "sink")


def _fa_setup_context(ctx, inputs, output):
    args = dict(zip(_FA_ARGS, inputs))
    out, smax, ssum = output
    ctx.save_for_backward(*(args[n] for n in _FA_TENSORS), out, smax, ssum)
    ctx.attrs = {n: args[n] for n in _FA_ARGS if n not in _FA_TENSORS}
    ctx.mark_non_differentiable(smax, ssum)


def _fa_backward(ctx, d_out, d_max, d_sum):
    saved = ctx.saved_tensors
    t = dict(zip(_FA_TENSORS, saved[: len(_FA_TENSORS)]))
    out, smax, ssum = saved[len(_FA_TENSORS):]
    a = ctx.attrs
    dq, dk, dv, dsink = flash_attention_score_grad(
        t["query"], t["key"], t["value"], d_out, t["pse"], t["drop_mask"], t["atten_mask"], smax, ssum, out,
        t["actual_seq_qlen"], t["actual_seq_kvlen"], t["sink"], a["prefix"], a["q_start_idx"],
        a["kv_start_idx"], a["scale"], a["keep_prob"], a["pre_tokens"], a["next_tokens"], a["head_num"],
        a["input_layout"], a["inner_precise"], a["sparse_mode"], a["pse_type"], a["seed"], a["offset"])
    grads = {"query": dq, "key": dk, "value": dv, "sink": dsink if t["sink"] is not None else None}
    return tuple(grads.get(n) for n in _FA_ARGS)


flash_attention_score.register_autograd(_fa_backward, setup_context=_fa_setup_context)


# ---------------------------------------------------------------------------------------------
# FlashAttentionScore(Grad) extended entry points (attnops/flash_attention_score_ex.h): dropout keyed
# by global positions, fp32 outputs and gradients from fp16/bf16 inputs, gradients added into fp32
# accumulators. Plain functions (no autograd): context parallelism (attnops.torch.cp) calls them
# from its own autograd functions.


class DropoutGeometry(NamedTuple):
    """Where this call's rows sit in a global problem, so that its dropout keep bits are those of
    the global problem (see attnopsFlashAttentionExtras): the keep bit of local (b, n, i, j) is the
    one of global (seq_index[b] (TND) or b, head_offset + n, q_rows[i], kv_rows[j]).

    head_num: global N1. Fixed layouts: q_seq_len/kv_seq_len = global S1/S2; TND:
    actual_seq_qlen/actual_seq_kvlen = the global cumulative lengths (no leading 0) and seq_index
    the global sequence of each local one (None: the same). q_rows/kv_rows: int64 tensors, the
    global position (within its sequence) of each local row (fixed: [S1]/[S2]; TND: [T1]/[T2]),
    or None: the sequence-local row plus q_row_offset/kv_row_offset."""

    head_num: int
    head_offset: int = 0
    q_seq_len: int = 0
    kv_seq_len: int = 0
    q_rows: Optional[Tensor] = None
    kv_rows: Optional[Tensor] = None
    q_row_offset: int = 0
    kv_row_offset: int = 0
    actual_seq_qlen: Optional[Tensor] = None
    actual_seq_kvlen: Optional[Tensor] = None
    seq_index: Optional[Tensor] = None


def _drop_args(drop: Optional[DropoutGeometry]):
    if drop is None:
        return (False, [0] * 6, None, None, None, None, None)
    ints = [drop.head_offset, drop.head_num, drop.q_seq_len, drop.kv_seq_len, drop.q_row_offset, drop.kv_row_offset]
    return (True, [int(x) for x in ints], drop.q_rows, drop.kv_rows, drop.actual_seq_qlen, drop.actual_seq_kvlen,
            drop.seq_index)


def flash_attention_score_ex(query: Tensor, key: Tensor, value: Tensor, atten_mask: Optional[Tensor],
                             actual_seq_qlen: Optional[Tensor], actual_seq_kvlen: Optional[Tensor], scale: float,
                             keep_prob: float, pre_tokens: int, next_tokens: int, head_num: int, input_layout: str,
                             sparse_mode: int, seed: int = 0, offset: int = 0, *, out_dtype=None,
                             drop: Optional[DropoutGeometry] = None, pse: Optional[Tensor] = None,
                             sink: Optional[Tensor] = None, prefix: Optional[List[int]] = None,
                             q_start_idx: Optional[List[int]] = None, kv_start_idx: Optional[List[int]] = None,
                             pse_type: int = 1, inner_precise: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """FlashAttentionScore through the extended entry point: (attention_out, softmax_max,
    softmax_sum). out_dtype: torch.float32 writes attention_out in fp32 whatever the input dtype
    (None: the input dtype). drop: the global dropout geometry (None: the plain keep bits)."""
    for name, t in (("query", query), ("key", key), ("value", value), ("atten_mask", atten_mask)):
        _cpu(name, t)
    out_shape, stat_shape = _fa_shapes(query, key, value, head_num, input_layout)
    out = query.new_empty(out_shape, dtype=out_dtype or query.dtype)
    smax = query.new_empty(stat_shape, dtype=torch.float32)
    ssum = query.new_empty(stat_shape, dtype=torch.float32)
    _C.flash_attention_score_ex(
        _plain(query), _plain(key), _plain(value), _plain(pse), None, atten_mask, prefix, actual_seq_qlen,
        actual_seq_kvlen, q_start_idx, kv_start_idx, _plain(sink), float(scale), float(keep_prob), int(pre_tokens),
        int(next_tokens), int(head_num), input_layout, inner_precise, int(sparse_mode), pse_type, int(seed),
        int(offset), out, smax, ssum, *_drop_args(drop))
    return out, smax, ssum


def flash_attention_score_grad_ex(query: Tensor, key: Tensor, value: Tensor, dy: Tensor, atten_mask: Optional[Tensor],
                                  softmax_max: Tensor, softmax_sum: Tensor, attention_in: Tensor,
                                  actual_seq_qlen: Optional[Tensor], actual_seq_kvlen: Optional[Tensor], scale: float,
                                  keep_prob: float, pre_tokens: int, next_tokens: int, head_num: int,
                                  input_layout: str, sparse_mode: int, seed: int = 0, offset: int = 0, *,
                                  grad_dtype=None, dq: Optional[Tensor] = None, dk: Optional[Tensor] = None,
                                  dv: Optional[Tensor] = None, accumulate: bool = False,
                                  drop: Optional[DropoutGeometry] = None, pse: Optional[Tensor] = None,
                                  sink: Optional[Tensor] = None, prefix: Optional[List[int]] = None,
                                  q_start_idx: Optional[List[int]] = None, kv_start_idx: Optional[List[int]] = None,
                                  pse_type: int = 1, inner_precise: int = 0):
    """FlashAttentionScoreGrad through the extended entry point: (dq, dk, dv, dsink). attention_in
    may be fp32. grad_dtype: dtype of the gradients allocated here (None: the inputs'). dq/dk/dv:
    caller's tensors to write (or, with accumulate=True, fp32 tensors to add into); the gradients
    not given are allocated."""
    grads = []
    for given, like in ((dq, query), (dk, key), (dv, value)):
        if given is None:
            if accumulate:
                raise ValueError("accumulate=True: dq, dk and dv must all be given (fp32 accumulators)")
            given = torch.empty(like.shape, dtype=grad_dtype or like.dtype)
        grads.append(given)
    dsink = torch.empty((sink.shape[0],) if sink is not None else (0,), dtype=torch.float32)
    _C.flash_attention_score_grad_ex(
        _plain(query), _plain(key), _plain(value), _plain(dy), _plain(pse), None, atten_mask, _plain(softmax_max),
        _plain(softmax_sum), _plain(attention_in), prefix, actual_seq_qlen, actual_seq_kvlen, q_start_idx,
        kv_start_idx, _plain(sink), float(scale), float(keep_prob), int(pre_tokens), int(next_tokens), int(head_num),
        input_layout, inner_precise, int(sparse_mode), pse_type, int(seed), int(offset), *grads,
        dsink if sink is not None else None, *_drop_args(drop), bool(accumulate))
    return grads[0], grads[1], grads[2], dsink


# ---------------------------------------------------------------------------------------------
# BlockAttentionResiduals


@torch.library.custom_op("attnops::block_attention_residuals", mutates_args=())
def block_attention_residuals(
    partial_block: Tensor,
    block_res: Tensor,
    proj_weight: Tensor,
    norm_weight: Tensor,
    valid_block_num: int,
    norm_eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """BlockAttentionResiduals: (hidden_states [T,H], inv_norm [T,N+1] fp32, probs [T,N+1] fp32)."""
    for name, t in (("partial_block", partial_block), ("block_res", block_res)):
        _cpu(name, t)
    hidden, inv, probs = _bar_outputs(partial_block, block_res)
    _C.block_attention_residuals(_plain(partial_block), _plain(block_res), _plain(proj_weight),
                                 _plain(norm_weight), valid_block_num, norm_eps, hidden, inv, probs)
    return hidden, inv, probs


def _bar_outputs(partial_block: Tensor, block_res: Tensor):
    if partial_block.dim() != 2:
        raise ValueError(f"partial_block: rank {partial_block.dim()}: must be 2 ([T,H])")
    if block_res.dim() != 3:
        raise ValueError(f"block_res: rank {block_res.dim()}: must be 3 ([T,N,H])")
    t, n = partial_block.shape[0], block_res.shape[1]
    return (partial_block.new_empty(partial_block.shape),
            partial_block.new_empty((t, n + 1), dtype=torch.float32),
            partial_block.new_empty((t, n + 1), dtype=torch.float32))


@block_attention_residuals.register_fake
def _(partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps):
    return _bar_outputs(partial_block, block_res)


@torch.library.custom_op("attnops::block_attention_residuals_backward", mutates_args=())
def block_attention_residuals_backward(
    partial_block: Tensor,
    block_res: Tensor,
    proj_weight: Tensor,
    norm_weight: Tensor,
    grad_hidden_states: Tensor,
    inv_norm: Tensor,
    probs: Tensor,
    valid_block_num: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """BlockAttentionResidualsGrad: (grad_partial_block, grad_block_res, grad_proj_weight,
    grad_norm_weight), shaped like the inputs."""
    grads = tuple(torch.empty(t.shape, dtype=t.dtype) for t in (partial_block, block_res, proj_weight, norm_weight))
    _C.block_attention_residuals_grad(_plain(partial_block), _plain(block_res), _plain(proj_weight),
                                      _plain(norm_weight), _plain(grad_hidden_states), _plain(inv_norm),
                                      _plain(probs), valid_block_num, *grads)
    return grads


@block_attention_residuals_backward.register_fake
def _(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs, valid_block_num):
    return tuple(t.new_empty(t.shape) for t in (partial_block, block_res, proj_weight, norm_weight))


def _bar_setup_context(ctx, inputs, output):
    pb, br, pw, nw, valid_block_num, _ = inputs
    _, inv, probs = output
    ctx.save_for_backward(pb, br, pw, nw, inv, probs)
    ctx.valid_block_num = valid_block_num
    ctx.mark_non_differentiable(inv, probs)


def _bar_backward(ctx, d_hidden, d_inv, d_probs):
    pb, br, pw, nw, inv, probs = ctx.saved_tensors
    gpb, gbr, gpw, gnw = block_attention_residuals_backward(pb, br, pw, nw, d_hidden, inv, probs,
                                                            ctx.valid_block_num)
    return gpb, gbr, gpw, gnw, None, None


block_attention_residuals.register_autograd(_bar_backward, setup_context=_bar_setup_context)
