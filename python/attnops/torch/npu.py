"""torch_npu-compatible entry points: code written for ``torch_npu.npu_fusion_attention`` runs on
CPU tensors by changing the import (``from attnops.torch import npu_fusion_attention``).

Signatures, argument names (including the historical ``pre_tockens``/``next_tockens``), defaults
(scale 1.0, not 1/sqrt(D)) and return tuples are torch_npu's. Additions, all keyword-only:
``pse_type``, ``q_start_idx``, ``kv_start_idx`` (torch_npu's v2 interface), ``sink`` and the
spellings ``pre_tokens``/``next_tokens``. ``gen_mask_parallel`` and ``sync`` are accepted and
change nothing (attnops always returns after the work is done).

atten_mask: None means no masking at all, whatever sparse_mode, pre_tockens and next_tockens say
(torch_npu's rule); modes 2-8 without a mask warn once per process (``UserWarning``).

Dropout: with keep_prob < 1 a fresh 64-bit seed is drawn from PyTorch's default generator
(``torch.manual_seed`` makes runs repeatable) with offset 0; the keep mask is a function of
(seed, offset) (shared/spec section 2.7a), so the backward regenerates it and nothing is stored.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import torch
from torch import Tensor

from . import _ops
from .merge import _check_softmax_layout, tnd_stats_from_token_major, tnd_stats_to_token_major

INT32_MAX = _ops.INT32_MAX


def _int_tensor(values) -> Optional[Tensor]:
    if values is None:
        return None
    if isinstance(values, Tensor):
        return values
    return torch.tensor(list(values), dtype=torch.int64)


def _int_list(values) -> Optional[list]:
    if values is None:
        return None
    if isinstance(values, Tensor):
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]


def _tokens(legacy: int, modern: Optional[int]) -> int:
    return legacy if modern is None else modern


_null_mask_warned = False


def _warn_null_mask(sparse_mode: int, atten_mask: Optional[Tensor]) -> None:
    """As torch_npu, a None atten_mask means no masking at all in every sparse mode. Modes 2-8
    name a causal or band mask, so passing none of it is probably a mistake: say so once per process."""
    global _null_mask_warned
    if atten_mask is None and sparse_mode >= 2 and not _null_mask_warned:
        _null_mask_warned = True
        warnings.warn(f"sparse_mode = {sparse_mode} with atten_mask = None: no masking is applied (as in torch_npu, a "
                      "None atten_mask means full attention in every mode); pass the compressed 2048x2048 mask for "
                      "causal or band attention", UserWarning, stacklevel=3)


def draw_seed() -> int:
    """A 63-bit seed from PyTorch's default CPU generator."""
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


def _numels(query: Tensor, key: Tensor, head_num: int, layout: str, actual_seq_qlen, actual_seq_kvlen) -> int:
    """Elements of the dropout mask, torch_npu's ``numels``: B*N1*S1*S2, or N1 * sum Sq_i*Skv_i for TND."""
    if layout == "TND":
        q = _int_list(actual_seq_qlen) or []
        k = _int_list(actual_seq_kvlen) or []
        total, pq, pk = 0, 0, 0
        for a, c in zip(q, k):
            total += max(a - pq, 0) * max(c - pk, 0)
            pq, pk = max(a, pq), max(c, pk)
        return head_num * total
    seq_axis = {"BSH": 1, "SBH": 0, "BSND": 1, "BNSD": 2}.get(layout, 1)
    batch_axis = 1 if layout == "SBH" else 0
    return int(query.shape[batch_axis]) * head_num * int(query.shape[seq_axis]) * int(key.shape[seq_axis])


def npu_fusion_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    head_num: int,
    input_layout: str,
    pse: Optional[Tensor] = None,
    padding_mask: Optional[Tensor] = None,
    atten_mask: Optional[Tensor] = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = INT32_MAX,
    next_tockens: int = INT32_MAX,
    inner_precise: int = 0,
    prefix: Optional[Sequence[int]] = None,
    actual_seq_qlen: Optional[Sequence[int]] = None,
    actual_seq_kvlen: Optional[Sequence[int]] = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    *,
    pse_type: int = 1,
    q_start_idx: Optional[Sequence[int]] = None,
    kv_start_idx: Optional[Sequence[int]] = None,
    sink: Optional[Tensor] = None,
    pre_tokens: Optional[int] = None,
    next_tokens: Optional[int] = None,
    softmax_layout: str = "",
):
    """Returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels).

    softmax_max/softmax_sum: fp32 [B,N1,S1,8] ([T1,N1,8] declared for TND), the value repeated in
    the 8 lanes; softmax_out is an empty tensor (reserved, as in torch_npu). Differentiable in
    query, key, value (and sink).

    TND statistics order (``softmax_layout``, torch_npu's attribute): "" (the default, as in
    torch_npu) returns them as torch_npu users' code reads them: per sequence a head-major
    [N1, s_i, 8] block, the blocks concatenated (MindSpeed's TND ring reads them so;
    attnops.torch.merge explains the evidence); "TND" returns them token-major, element (t, n)
    at t*N1 + n. Other layouts ignore it.
    """
    if padding_mask is not None:
        raise ValueError("padding_mask: given: reserved, must be None")
    _check_softmax_layout("softmax_layout", softmax_layout)
    _warn_null_mask(sparse_mode, atten_mask)
    if keep_prob < 1.0:
        seed, offset = draw_seed(), 0
        numels = _numels(query, key, head_num, input_layout, actual_seq_qlen, actual_seq_kvlen)
    else:
        seed, offset, numels = 0, 0, 0
    out, smax, ssum = _ops.flash_attention_score(
        query, key, value, pse, None, atten_mask, _int_tensor(actual_seq_qlen), _int_tensor(actual_seq_kvlen),
        sink, _int_list(prefix), _int_list(q_start_idx), _int_list(kv_start_idx), float(scale),
        float(keep_prob), _tokens(pre_tockens, pre_tokens), _tokens(next_tockens, next_tokens), head_num,
        input_layout, inner_precise, sparse_mode, pse_type, seed, offset)
    if input_layout == "TND" and softmax_layout != "TND":
        smax, ssum = (tnd_stats_from_token_major(x, actual_seq_qlen) for x in (smax, ssum))
    softmax_out = query.new_empty((0,))
    return out, smax, ssum, softmax_out, seed, offset, numels


def npu_fusion_attention_grad(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dy: Tensor,
    head_num: int,
    input_layout: str,
    *,
    pse: Optional[Tensor] = None,
    padding_mask: Optional[Tensor] = None,
    atten_mask: Optional[Tensor] = None,
    softmax_max: Optional[Tensor] = None,
    softmax_sum: Optional[Tensor] = None,
    softmax_in: Optional[Tensor] = None,
    attention_in: Optional[Tensor] = None,
    scale_value: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = INT32_MAX,
    next_tockens: int = INT32_MAX,
    inner_precise: int = 0,
    seed: int = 0,
    offset: int = 0,
    numels: int = 0,
    prefix: Optional[Sequence[int]] = None,
    actual_seq_qlen: Optional[Sequence[int]] = None,
    actual_seq_kvlen: Optional[Sequence[int]] = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    pse_type: int = 1,
    q_start_idx: Optional[Sequence[int]] = None,
    kv_start_idx: Optional[Sequence[int]] = None,
    sink: Optional[Tensor] = None,
    pre_tokens: Optional[int] = None,
    next_tokens: Optional[int] = None,
    softmax_layout: str = "",
):
    """Returns (dq, dk, dv, dpse); dpse is an empty tensor (pse gradients are not produced, as
    upstream). softmax_max, softmax_sum and attention_in (the forward's outputs) are required.
    With a sink, its gradient is returned as a fifth element. softmax_layout: the order of TND
    statistics, as in npu_fusion_attention."""
    if padding_mask is not None:
        raise ValueError("padding_mask: given: reserved, must be None")
    for name, t in (("softmax_max", softmax_max), ("softmax_sum", softmax_sum), ("attention_in", attention_in)):
        if t is None:
            raise ValueError(f"{name}: None: required (the forward's output)")
    _check_softmax_layout("softmax_layout", softmax_layout)
    if input_layout == "TND" and softmax_layout != "TND":
        softmax_max, softmax_sum = (tnd_stats_to_token_major(x, actual_seq_qlen) for x in (softmax_max, softmax_sum))
    _warn_null_mask(sparse_mode, atten_mask)
    dq, dk, dv, dsink = _ops.flash_attention_score_grad(
        query, key, value, dy, pse, None, atten_mask, softmax_max, softmax_sum, attention_in,
        _int_tensor(actual_seq_qlen), _int_tensor(actual_seq_kvlen), sink, _int_list(prefix),
        _int_list(q_start_idx), _int_list(kv_start_idx), float(scale_value), float(keep_prob),
        _tokens(pre_tockens, pre_tokens), _tokens(next_tockens, next_tokens), head_num, input_layout,
        inner_precise, sparse_mode, pse_type, seed, offset)
    dpse = query.new_empty((0,))
    if sink is not None:
        return dq, dk, dv, dpse, dsink
    return dq, dk, dv, dpse


def npu_gen_drop_mask(query: Tensor, key: Tensor, head_num: int, input_layout: str, keep_prob: float, seed: int,
                      offset: int = 0, actual_seq_qlen=None, actual_seq_kvlen=None) -> Tensor:
    """The bit-packed uint8 keep mask npu_fusion_attention uses for (keep_prob, seed, offset)."""
    from .. import _C

    aq, ak = _int_tensor(actual_seq_qlen), _int_tensor(actual_seq_kvlen)
    if input_layout == "TND":
        b = s1 = s2 = 0
    else:
        seq_axis = {"BSH": 1, "SBH": 0, "BSND": 1, "BNSD": 2}[input_layout]
        b = int(query.shape[1 if input_layout == "SBH" else 0])
        s1, s2 = int(query.shape[seq_axis]), int(key.shape[seq_axis])
    nbytes = _C.flash_attention_drop_mask_bytes(b, head_num, s1, s2, aq, ak)
    mask = torch.empty(nbytes, dtype=torch.uint8)
    _C.flash_attention_gen_drop_mask(b, head_num, s1, s2, aq, ak, float(keep_prob), seed, offset, mask)
    return mask
