"""flash-attn's ``flash_attn.flash_attn_interface`` on attnops, including the private
``_flash_attn_forward`` / ``_flash_attn_backward`` (and varlen) functions that libraries built on
flash-attn call directly (ring-flash-attention, yunchang), with flash-attn 2.7's conventions:

- ``_flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
  window_size_right, softcap, alibi_slopes, return_softmax)`` -> (out, softmax_lse [B,H,Sq] fp32,
  S_dmask None, rng_state None); varlen: q/k/v [total,H,D], cu_seqlens int32 with a leading 0,
  softmax_lse [H,total_q].
- ``_flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, ...)`` writes the gradients
  into the caller's dq, dk, dv (views are fine) and returns softmax_d (rowsum(dout * out), fp32
  [B,H,Sq] / [H,total_q]). The backward takes lse from outside: a merged, global one works (ring
  attention relies on it).
- Rows that see no key have lse -inf (flash-attn writes +inf): a merge by log-sum-exp then ignores
  them instead of producing NaN.
- dropout_p must be 0, softcap 0, alibi_slopes None here (the public functions in
  attnops.torch.flash_attn support dropout and ALiBi).

:func:`install` registers this module as ``flash_attn`` / ``flash_attn.flash_attn_interface`` in
``sys.modules``, so code that imports flash-attn runs on attnops unchanged (call it before that
code is imported).
"""

from __future__ import annotations

import sys
import types
from typing import Optional

import torch
from torch import Tensor

from . import _ops
from .flash_attn import (_mask_args, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                         flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)

__all__ = [
    "_flash_attn_backward",
    "_flash_attn_forward",
    "_flash_attn_varlen_backward",
    "_flash_attn_varlen_forward",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "install",
]


def _check(dropout_p, softcap, alibi_slopes) -> None:
    if dropout_p:
        raise ValueError(f"dropout_p = {dropout_p}: the private flash-attn functions of attnops support no dropout, "
                         "must be 0")
    if softcap:
        raise ValueError(f"softcap = {softcap}: not supported by attnops, must be 0.0")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: given: not supported by attnops' private flash-attn functions, must be None")


def _lse(smax: Tensor, ssum: Tensor) -> Tensor:
    return smax[..., 0] + torch.log(ssum[..., 0])


def _stats_from_lse(lse: Tensor):
    """(softmax_max, softmax_sum) that make the grad kernel read P = exp(score - lse); empty rows
    (lse -inf) become the kernel's empty rows (max -inf, sum 0)."""
    lse = lse.float()
    return lse[..., None].contiguous(), torch.where(torch.isneginf(lse), 0.0, 1.0)[..., None]


def _forward(q, k, v, softmax_scale, causal, window_size_left, window_size_right, layout, cu_q=None, cu_k=None):
    mode, pre, nxt, mask = _mask_args(causal, (window_size_left, window_size_right))
    heads = q.shape[2] if layout == "BSND" else q.shape[1]
    out, smax, ssum = _ops.flash_attention_score(q, k, v, None, None, mask, cu_q, cu_k, None, None, None, None,
                                                 float(softmax_scale), 1.0, pre, nxt, heads, layout, 0, mode, 1, 0, 0)
    return out, _lse(smax, ssum)


def _backward(dout, q, k, v, out, lse_bns, dq, dk, dv, softmax_scale, causal, window_size_left, window_size_right,
              layout, cu_q=None, cu_k=None):
    mode, pre, nxt, mask = _mask_args(causal, (window_size_left, window_size_right))
    heads = q.shape[2] if layout == "BSND" else q.shape[1]
    smax, ssum = _stats_from_lse(lse_bns)
    gq, gk, gv, _ = _ops.flash_attention_score_grad(q, k, v, dout, None, None, mask, smax, ssum, out, cu_q, cu_k, None,
                                                    None, None, None, float(softmax_scale), 1.0, pre, nxt, heads,
                                                    layout, 0, mode, 1, 0, 0)
    for buf, g in ((dq, gq), (dk, gk), (dv, gv)):
        if buf is not None:
            buf.copy_(g)
    return gq, gk, gv


def _flash_attn_forward(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float, causal: bool,
                        window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
                        alibi_slopes: Optional[Tensor] = None, return_softmax: bool = False):
    """q [B,Sq,H,D], k/v [B,Sk,Hk,D] -> (out, softmax_lse [B,H,Sq] fp32, None, None)."""
    _check(dropout_p, softcap, alibi_slopes)
    out, lse = _forward(q, k, v, softmax_scale, causal, window_size_left, window_size_right, "BSND")
    return out, lse, None, None


def _flash_attn_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
                         dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor], dropout_p: float,
                         softmax_scale: float, causal: bool, window_size_left: int = -1, window_size_right: int = -1,
                         softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                         rng_state: Optional[Tensor] = None) -> Tensor:
    """Gradients into dq, dk, dv; returns softmax_d [B,H,Sq] fp32."""
    _check(dropout_p, softcap, alibi_slopes)
    # attnops' grad reads the statistics as [B,H,S,1]: softmax_lse's own order.
    _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal, window_size_left,
              window_size_right, "BSND")
    return (dout.float() * out.float()).sum(-1).transpose(1, 2)


def _flash_attn_varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                               max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: float,
                               causal: bool, window_size_left: int = -1, window_size_right: int = -1,
                               softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                               return_softmax: bool = False, block_table: Optional[Tensor] = None,
                               leftpad_k: Optional[Tensor] = None, seqused_k: Optional[Tensor] = None,
                               zero_tensors: bool = False):
    """q [total_q,H,D], k/v [total_k,Hk,D] -> (out, softmax_lse [H,total_q] fp32, None, None)."""
    _check(dropout_p, softcap, alibi_slopes)
    for name, val in (("block_table", block_table), ("leftpad_k", leftpad_k), ("seqused_k", seqused_k)):
        if val is not None:
            raise ValueError(f"{name}: given: not supported by attnops, must be None")
    out, lse = _forward(q, k, v, softmax_scale, causal, window_size_left, window_size_right, "TND", cu_seqlens_q[1:],
                        cu_seqlens_k[1:])
    return out, lse.transpose(0, 1).contiguous(), None, None


def _flash_attn_varlen_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
                                dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor],
                                cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                dropout_p: float, softmax_scale: float, causal: bool, window_size_left: int = -1,
                                window_size_right: int = -1, softcap: float = 0.0,
                                alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                rng_state: Optional[Tensor] = None, zero_tensors: bool = False) -> Tensor:
    """Gradients into dq, dk, dv; returns softmax_d [H,total_q] fp32."""
    _check(dropout_p, softcap, alibi_slopes)
    # softmax_lse [H,T] -> attnops' TND statistics [T,H,1] (token-major).
    _backward(dout, q, k, v, out, softmax_lse.transpose(0, 1), dq, dk, dv, softmax_scale, causal, window_size_left,
              window_size_right, "TND", cu_seqlens_q[1:], cu_seqlens_k[1:])
    return (dout.float() * out.float()).sum(-1).transpose(0, 1)


def install() -> None:
    """Makes ``import flash_attn`` and ``from flash_attn.flash_attn_interface import ...`` give
    attnops' functions (for code written against flash-attn; no-op if already installed)."""
    this = sys.modules[__name__]
    pkg = sys.modules.get("flash_attn")
    if pkg is None or getattr(pkg, "__attnops__", False) is False:
        pkg = types.ModuleType("flash_attn")
        pkg.__attnops__ = True
        pkg.__version__ = "2.7.4"  # the flash-attn interface these functions follow
        pkg.__path__ = []
        for name in __all__:
            if not name.startswith("_") and name != "install":
                setattr(pkg, name, getattr(this, name))
        pkg.flash_attn_interface = this
        sys.modules["flash_attn"] = pkg
    sys.modules["flash_attn.flash_attn_interface"] = this
