"""flash-attn 2 interface (``flash_attn.flash_attn_func`` and friends) on attnops' FlashAttentionScore,
for CPU tensors: code written for flash-attn runs by changing the import.

Mapping onto FlashAttentionScore:
- q/k/v [B,S,H,D] -> layout BSND; varlen q/k/v [total,H,D] -> TND with
  actual_seq = cu_seqlens[1:] (flash-attn's int32 cu_seqlens start with 0, attnops' cumulative
  lengths do not); max_seqlen_* are accepted and not needed.
- softmax_scale: default 1/sqrt(D).
- causal: bottom-right aligned (query i sees keys j <= i + Sk - Sq), sparse mode 3;
  window_size (left, right), -1 = unbounded: bottom-right band, sparse mode 4 with
  pre_tokens = left, next_tokens = right (0 with causal). Both pass the compressed 2048x2048
  mask, as torch_npu users do: a NULL atten_mask would mean no masking at all.
- alibi_slopes fp32 [H] or [B,H]: bias -slope * |i + Sk - Sq - j| added after scaling (pse_type 2,
  with q_start_idx - kv_start_idx = Sk - Sq).
- dropout_p: keep_prob = 1 - dropout_p, mask drawn from a seed of PyTorch's default generator and
  regenerated in the backward.
- deterministic: attnops is always deterministic; the flag is accepted.
- return_attn_probs: (out, softmax_lse, None); softmax_lse fp32 [B,H,Sq] ([H,total_q] varlen),
  log-sum-exp of the scaled scores (-inf for rows that see no key). The attention probabilities
  themselves are not returned. Gradients do not flow through softmax_lse.
- softcap must be 0 (not supported); block_table must be None (no paged KV cache).
Rows that see no key (causal with Sq > Sk, windows) give 0, as in flash-attn.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ops
from .npu import draw_seed

INT32_MAX = _ops.INT32_MAX


# The compressed 2048x2048 mask of sparse modes 2-4 (True above the diagonal; only its shape is
# read). Made at import, so that torch.compile sees a constant.
_CAUSAL_MASK = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


def _mask_args(causal: bool, window_size: Tuple[int, int]):
    """(sparse_mode, pre_tokens, next_tokens, atten_mask) for flash-attn's causal flag and window."""
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    if left < 0 and right < 0:
        return 0, INT32_MAX, INT32_MAX, None
    if causal and left < 0:
        return 3, INT32_MAX, 0, _CAUSAL_MASK
    return 4, (left if left >= 0 else INT32_MAX), (right if right >= 0 else INT32_MAX), _CAUSAL_MASK


def _check_unsupported(softcap: float, block_table=None) -> None:
    if softcap != 0.0:
        raise ValueError(f"softcap = {softcap}: not supported by attnops, must be 0.0")
    if block_table is not None:
        raise ValueError("block_table: given: paged KV caches are not supported by attnops, must be None")


def _dropout_args(dropout_p: float):
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p = {dropout_p}: must be in [0, 1)")
    if dropout_p == 0.0:
        return 1.0, 0
    return 1.0 - dropout_p, draw_seed()


def _lse(smax: Tensor, ssum: Tensor) -> Tensor:
    return (smax[..., 0] + torch.log(ssum[..., 0])).detach()


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False):
    """q [B,Sq,H,D], k/v [B,Sk,Hk,D] (H % Hk == 0, GQA/MQA) -> out [B,Sq,H,D]."""
    _check_unsupported(softcap)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mode, pre, nxt, mask = _mask_args(causal, window_size)
    keep_prob, seed = _dropout_args(dropout_p)
    pse, pse_type, qs, ks = None, 1, None, None
    if alibi_slopes is not None:
        sq, sk = q.shape[1], k.shape[1]
        pse, pse_type, qs, ks = alibi_slopes, 2, [max(sk - sq, 0)], [max(sq - sk, 0)]
    out, smax, ssum = _ops.flash_attention_score(
        q, k, v, pse, None, mask, None, None, None, None, qs, ks, float(scale), keep_prob, pre, nxt, q.shape[2],
        "BSND", 0, mode, pse_type, seed, 0)
    if return_attn_probs:
        return out, _lse(smax, ssum), None
    return out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None):
    """q [total_q,H,D], k/v [total_k,Hk,D], cu_seqlens_* int32 [B+1] starting at 0 -> out [total_q,H,D]."""
    _check_unsupported(softcap, block_table)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    mode, pre, nxt, mask = _mask_args(causal, window_size)
    keep_prob, seed = _dropout_args(dropout_p)
    pse, pse_type, qs, ks = None, 1, None, None
    if alibi_slopes is not None:
        # One start-index pair serves every sequence: their Sk - Sq must agree.
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        shifts = {(ck[i + 1] - ck[i]) - (cq[i + 1] - cq[i]) for i in range(len(cq) - 1)}
        if len(shifts) > 1:
            raise ValueError(f"alibi_slopes with cu_seqlens_k - cu_seqlens_q differences {sorted(shifts)}: "
                             "attnops needs the same key-minus-query length in every sequence")
        shift = shifts.pop() if shifts else 0
        pse, pse_type, qs, ks = alibi_slopes, 2, [max(shift, 0)], [max(-shift, 0)]
    out, smax, ssum = _ops.flash_attention_score(
        q, k, v, pse, None, mask, cu_seqlens_q[1:], cu_seqlens_k[1:], None, None, qs, ks, float(scale), keep_prob,
        pre, nxt, q.shape[1], "TND", 0, mode, pse_type, seed, 0)
    if return_attn_probs:
        return out, _lse(smax, ssum).transpose(0, 1), None
    return out


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False):
    """qkv [B,S,3,H,D]; q, k and v are read in place (strided views, no copy)."""
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False):
    """q [B,Sq,H,D], kv [B,Sk,2,Hk,D]."""
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False):
    """qkv [total,3,H,D]."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False):
    """q [total_q,H,D], kv [total_k,2,Hk,D]."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)
