"""Inference attention for PyTorch (CPU tensors): torch_npu's ``npu_fused_infer_attention_score``,
``npu_fused_infer_attention_score_v2``, ``npu_incre_flash_attention`` and
``npu_prompt_flash_attention``, and flash-attn's ``flash_attn_with_kvcache``. All of them run the one
FusedInferAttentionScore core (include/attnops/fused_infer_attention_score.h says what is
implemented; everything else raises with a message naming the argument).

The torch_npu functions keep torch_npu's names, defaults (``scale`` 1.0, not 1/sqrt(D); PFA's
``next_tokens`` 0) and return values (FIA: ``(attention_out, softmax_lse)``, with ``softmax_lse``
of shape (0,) when not requested, as op-plugin allocates it; IFA and PFA: ``attention_out``).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _C

INT32_MAX = 2147483647
# The compressed causal mask of sparse modes 2-4: only its shape is checked by the library.
_COMPRESSED = 2048


def _int_tensor(values) -> Optional[Tensor]:
    if values is None:
        return None
    if isinstance(values, Tensor):
        return values.to(torch.int64)
    return torch.tensor([int(v) for v in values], dtype=torch.int64)


def _value_dim(value: Tensor, layout: str, kv_heads: int, paged: bool) -> int:
    """V_D from value's shape (spec 13.1): paged 3-D (BnBsH) H / KV_N, 4-D dim 3, 5-D (NZ) dim 2 * dim 4;
    x 8 for int4 held in int32 containers."""
    if value.dtype == torch.int32:
        return 8 * _value_dim(value.view(torch.float32), layout, kv_heads, paged)
    if paged:
        if value.dim() == 3:
            return value.shape[2] // kv_heads if kv_heads > 0 else 0
        if value.dim() == 5:
            return value.shape[2] * value.shape[4]
        return value.shape[-1]
    if layout == "BSH":
        return value.shape[2] // kv_heads if kv_heads > 0 else 0
    return value.shape[-1]


def _out_dtype(query: Tensor, quant_scale2: Optional[Tensor], query_rope: Optional[Tensor] = None) -> torch.dtype:
    """attention_out's dtype (spec 13.1): int8 with quant_scale2, else the query's; for an int8 query
    (full quantisation, spec 9.2) the query rope's (MLA full quant: bf16) if given, else fp16."""
    if quant_scale2 is not None:
        return torch.int8
    if query.dtype == torch.int8:
        return query_rope.dtype if query_rope is not None else torch.float16
    return query.dtype


_FIA_LAYOUTS = ("BSH", "BSND", "BNSD", "TND", "NTD", "BNSD_BSND", "BSH_BNSD", "BSND_BNSD", "BSH_NBSD", "BSND_NBSD",
                "BNSD_NBSD", "NTD_TND", "TND_NTD")


def _fia_shapes(query: Tensor, value: Tensor, layout: str, num_heads: int, num_kv_heads: int, paged: bool):
    """(attention_out shape, softmax_lse shape) of a call (spec 4: X_Y takes X and returns Y; NBSD
    is (Q_N, B, Q_S, V_D); the lse is (B, Q_N, Q_S, 1), or (T, Q_N, 1) for the packed layouts); the
    library validates the rest."""
    if layout not in _FIA_LAYOUTS:
        raise ValueError(f"input_layout = {layout!r}: must be one of {', '.join(_FIA_LAYOUTS)}")
    base, _, out_form = layout.partition("_")
    out_form = out_form or base
    ranks = {"BSH": 3, "BSND": 4, "BNSD": 4, "TND": 3, "NTD": 3}
    if query.dim() != ranks[base]:
        raise ValueError(f"query: rank {query.dim()} for input_layout {layout}: must be {ranks[base]}")
    kv_heads = num_kv_heads if num_kv_heads > 0 else num_heads
    dv = _value_dim(value, base, kv_heads, paged)
    if base in ("TND", "NTD"):
        t = query.shape[0] if base == "TND" else query.shape[1]
        return ((t, num_heads, dv) if out_form == "TND" else (num_heads, t, dv)), (t, num_heads, 1)
    b, s = (query.shape[0], query.shape[2]) if base == "BNSD" else (query.shape[0], query.shape[1])
    n = num_heads
    out = {"BSH": (b, s, n * dv), "BSND": (b, s, n, dv), "BNSD": (b, n, s, dv), "NBSD": (n, b, s, dv)}[out_form]
    return out, (b, n, s, 1)


@torch.library.custom_op("attnops::fused_infer_attention_score", mutates_args=())
def fused_infer_attention_score(
    query: Tensor, key: Tensor, value: Tensor,
    pse_shift: Optional[Tensor], atten_mask: Optional[Tensor],
    actual_seq_lengths: Optional[Tensor], actual_seq_lengths_kv: Optional[Tensor],
    dequant_scale1: Optional[Tensor], quant_scale1: Optional[Tensor], dequant_scale2: Optional[Tensor],
    quant_scale2: Optional[Tensor], quant_offset2: Optional[Tensor],
    antiquant_scale: Optional[Tensor], antiquant_offset: Optional[Tensor], block_table: Optional[Tensor],
    query_padding_size: Optional[Tensor], kv_padding_size: Optional[Tensor],
    key_antiquant_scale: Optional[Tensor], key_antiquant_offset: Optional[Tensor],
    value_antiquant_scale: Optional[Tensor], value_antiquant_offset: Optional[Tensor],
    key_shared_prefix: Optional[Tensor], value_shared_prefix: Optional[Tensor],
    actual_shared_prefix_len: Optional[Tensor], query_rope: Optional[Tensor], key_rope: Optional[Tensor],
    key_rope_antiquant_scale: Optional[Tensor], dequant_scale_query: Optional[Tensor],
    learnable_sink: Optional[Tensor],
    num_heads: int, scale: float, pre_tokens: int, next_tokens: int, input_layout: str,
    num_key_value_heads: int, sparse_mode: int, inner_precise: int, block_size: int, antiquant_mode: int,
    key_antiquant_mode: int, value_antiquant_mode: int, query_quant_mode: int, softmax_lse_flag: bool,
) -> Tuple[Tensor, Tensor]:
    """FusedInferAttentionScore V4 (include/attnops/fused_infer_attention_score.h): (attention_out,
    softmax_lse); softmax_lse has shape (0,) unless softmax_lse_flag."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.device.type != "cpu":
            raise ValueError(f"{name}: device {t.device}: attnops runs on CPU tensors")
    out_shape, lse_shape = _fia_shapes(query, value, input_layout, num_heads, num_key_value_heads,
                                       block_table is not None)
    out = query.new_empty(out_shape, dtype=_out_dtype(query, quant_scale2, query_rope))
    lse = query.new_empty(lse_shape if softmax_lse_flag else (0,), dtype=torch.float32)
    _C.fused_infer_attention_score(
        query, key, value, pse_shift, atten_mask, actual_seq_lengths, actual_seq_lengths_kv, dequant_scale1,
        quant_scale1, dequant_scale2, quant_scale2, quant_offset2, antiquant_scale, antiquant_offset, block_table,
        query_padding_size, kv_padding_size, key_antiquant_scale, key_antiquant_offset, value_antiquant_scale,
        value_antiquant_offset, key_shared_prefix, value_shared_prefix, actual_shared_prefix_len, query_rope,
        key_rope, key_rope_antiquant_scale, dequant_scale_query, learnable_sink, num_heads, scale, pre_tokens,
        next_tokens, input_layout, num_key_value_heads, sparse_mode, inner_precise, block_size, antiquant_mode,
        key_antiquant_mode, value_antiquant_mode, query_quant_mode, out, lse if softmax_lse_flag else None)
    return out, lse


@fused_infer_attention_score.register_fake
def _(query, key, value, pse_shift, atten_mask, actual_seq_lengths, actual_seq_lengths_kv, dequant_scale1,
      quant_scale1, dequant_scale2, quant_scale2, quant_offset2, antiquant_scale, antiquant_offset, block_table,
      query_padding_size, kv_padding_size, key_antiquant_scale, key_antiquant_offset, value_antiquant_scale,
      value_antiquant_offset, key_shared_prefix, value_shared_prefix, actual_shared_prefix_len, query_rope, key_rope,
      key_rope_antiquant_scale, dequant_scale_query, learnable_sink, num_heads, scale, pre_tokens, next_tokens,
      input_layout, num_key_value_heads, sparse_mode, inner_precise, block_size, antiquant_mode, key_antiquant_mode,
      value_antiquant_mode, query_quant_mode, softmax_lse_flag):
    out_shape, lse_shape = _fia_shapes(query, value, input_layout, num_heads, num_key_value_heads,
                                       block_table is not None)
    return (query.new_empty(out_shape, dtype=_out_dtype(query, quant_scale2, query_rope)),
            query.new_empty(lse_shape if softmax_lse_flag else (0,), dtype=torch.float32))


def _call(query, key, value, *, actual_seq_lengths=None, actual_seq_lengths_kv=None, actual_shared_prefix_len=None,
          num_heads=1, scale=1.0, pre_tokens=INT32_MAX, next_tokens=INT32_MAX, input_layout="BSH",
          num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0, antiquant_mode=0,
          key_antiquant_mode=0, value_antiquant_mode=0, query_quant_mode=0, softmax_lse_flag=False, **tensors):
    names = ("pse_shift", "atten_mask", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2",
             "quant_offset2", "antiquant_scale", "antiquant_offset", "block_table", "query_padding_size",
             "kv_padding_size", "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
             "value_antiquant_offset", "key_shared_prefix", "value_shared_prefix", "query_rope", "key_rope",
             "key_rope_antiquant_scale", "dequant_scale_query", "learnable_sink")
    unknown = set(tensors) - set(names)
    if unknown:
        raise TypeError(f"unexpected arguments {sorted(unknown)}")
    t = {n: tensors.get(n) for n in names}
    return torch.ops.attnops.fused_infer_attention_score(
        query, key, value, t["pse_shift"], t["atten_mask"], _int_tensor(actual_seq_lengths),
        _int_tensor(actual_seq_lengths_kv), t["dequant_scale1"], t["quant_scale1"], t["dequant_scale2"],
        t["quant_scale2"], t["quant_offset2"], t["antiquant_scale"], t["antiquant_offset"], t["block_table"],
        t["query_padding_size"], t["kv_padding_size"], t["key_antiquant_scale"], t["key_antiquant_offset"],
        t["value_antiquant_scale"], t["value_antiquant_offset"], t["key_shared_prefix"], t["value_shared_prefix"],
        _int_tensor(actual_shared_prefix_len), t["query_rope"], t["key_rope"], t["key_rope_antiquant_scale"],
        t["dequant_scale_query"], t["learnable_sink"], int(num_heads), float(scale), int(pre_tokens),
        int(next_tokens), str(input_layout), int(num_key_value_heads), int(sparse_mode), int(inner_precise),
        int(block_size), int(antiquant_mode), int(key_antiquant_mode), int(value_antiquant_mode),
        int(query_quant_mode), bool(softmax_lse_flag))


def npu_fused_infer_attention_score(
    query: Tensor, key: Tensor, value: Tensor, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
    actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
    quant_offset2=None, antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None,
    key_antiquant_offset=None, value_antiquant_scale=None, value_antiquant_offset=None, block_table=None,
    query_padding_size=None, kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
    actual_shared_prefix_len=None, query_rope=None, key_rope=None, key_rope_antiquant_scale=None, num_heads=1,
    scale=1.0, pre_tokens=INT32_MAX, next_tokens=INT32_MAX, input_layout="BSH", num_key_value_heads=0,
    sparse_mode=0, inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
    softmax_lse_flag=False,
) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_fused_infer_attention_score (spec 13.1): (attention_out, softmax_lse)."""
    return _call(query, key, value, pse_shift=pse_shift, atten_mask=atten_mask,
                 actual_seq_lengths=actual_seq_lengths, actual_seq_lengths_kv=actual_seq_lengths_kv,
                 dequant_scale1=dequant_scale1, quant_scale1=quant_scale1, dequant_scale2=dequant_scale2,
                 quant_scale2=quant_scale2, quant_offset2=quant_offset2, antiquant_scale=antiquant_scale,
                 antiquant_offset=antiquant_offset, key_antiquant_scale=key_antiquant_scale,
                 key_antiquant_offset=key_antiquant_offset, value_antiquant_scale=value_antiquant_scale,
                 value_antiquant_offset=value_antiquant_offset, block_table=block_table,
                 query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
                 key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
                 actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope, key_rope=key_rope,
                 key_rope_antiquant_scale=key_rope_antiquant_scale, num_heads=num_heads, scale=scale,
                 pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
                 num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode, inner_precise=inner_precise,
                 block_size=block_size, antiquant_mode=antiquant_mode, key_antiquant_mode=key_antiquant_mode,
                 value_antiquant_mode=value_antiquant_mode, softmax_lse_flag=softmax_lse_flag)


def npu_fused_infer_attention_score_v2(
    query: Tensor, key: Tensor, value: Tensor, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
    actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None, dequant_scale_query=None, dequant_scale_key=None,
    dequant_offset_key=None, dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
    quant_scale_out=None, quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
    num_key_value_heads=0, softmax_scale=1.0, pre_tokens=INT32_MAX, next_tokens=INT32_MAX, input_layout="BSH",
    sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
    return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
    key_rope_dtype=None, key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
    dequant_scale_query_dtype=None, dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
    dequant_scale_key_rope_dtype=None, out_dtype=None,
) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_fused_infer_attention_score_v2 (spec 13.2, aclnn V4): (attention_out, softmax_lse)."""
    if quant_scale_p is not None:
        raise NotImplementedError("quant_scale_p: used on the Ascend 950 only, which attnops does not cover")
    overrides = dict(query_dtype=query_dtype, key_dtype=key_dtype, value_dtype=value_dtype,
                     query_rope_dtype=query_rope_dtype, key_rope_dtype=key_rope_dtype,
                     key_shared_prefix_dtype=key_shared_prefix_dtype,
                     value_shared_prefix_dtype=value_shared_prefix_dtype,
                     dequant_scale_query_dtype=dequant_scale_query_dtype,
                     dequant_scale_key_dtype=dequant_scale_key_dtype,
                     dequant_scale_value_dtype=dequant_scale_value_dtype,
                     dequant_scale_key_rope_dtype=dequant_scale_key_rope_dtype, out_dtype=out_dtype)
    given = [k for k, v in overrides.items() if v is not None]
    if given:
        raise NotImplementedError(f"{given[0]}: dtype overrides (the 950's FP8/HiF8/FP4 formats) are not supported; "
                                  "pass tensors of their real dtype")
    return _call(query, key, value, query_rope=query_rope, key_rope=key_rope, pse_shift=pse_shift,
                 atten_mask=atten_mask, actual_seq_lengths=actual_seq_qlen, actual_seq_lengths_kv=actual_seq_kvlen,
                 block_table=block_table, dequant_scale_query=dequant_scale_query,
                 key_antiquant_scale=dequant_scale_key, key_antiquant_offset=dequant_offset_key,
                 value_antiquant_scale=dequant_scale_value, value_antiquant_offset=dequant_offset_value,
                 key_rope_antiquant_scale=dequant_scale_key_rope, quant_scale2=quant_scale_out,
                 quant_offset2=quant_offset_out, learnable_sink=learnable_sink, num_heads=num_query_heads,
                 num_key_value_heads=num_key_value_heads, scale=softmax_scale, pre_tokens=pre_tokens,
                 next_tokens=next_tokens, input_layout=input_layout, sparse_mode=sparse_mode, block_size=block_size,
                 query_quant_mode=query_quant_mode, key_antiquant_mode=key_quant_mode,
                 value_antiquant_mode=value_quant_mode, inner_precise=inner_precise,
                 softmax_lse_flag=return_softmax_lse)


def npu_incre_flash_attention(
    query: Tensor, key: Tensor, value: Tensor, *, padding_mask=None, atten_mask=None, pse_shift=None,
    actual_seq_lengths=None, antiquant_scale=None, antiquant_offset=None, block_table=None, dequant_scale1=None,
    quant_scale1=None, dequant_scale2=None, quant_scale2=None, quant_offset2=None, kv_padding_size=None,
    num_heads=1, scale_value=1.0, input_layout="BSH", num_key_value_heads=0, block_size=0, inner_precise=1,
) -> Tensor:
    """torch_npu.npu_incre_flash_attention (spec 13.3, aclnn IFA V4): decode, one query token per
    sequence; actual_seq_lengths are the KV lengths; padding_mask is reserved upstream (ignored)."""
    if input_layout not in ("BSH", "BSND", "BNSD"):
        raise ValueError(f"input_layout = {input_layout!r}: npu_incre_flash_attention takes BSH, BSND or BNSD")
    s = query.shape[2] if input_layout == "BNSD" else query.shape[1] if query.dim() >= 2 else -1
    if s != 1:
        raise ValueError(f"query: shape {tuple(query.shape)}: npu_incre_flash_attention decodes one token, the query's "
                         f"S must be 1, not {s}")
    out, _ = _call(query, key, value, atten_mask=atten_mask, pse_shift=pse_shift,
                   actual_seq_lengths_kv=actual_seq_lengths, antiquant_scale=antiquant_scale,
                   antiquant_offset=antiquant_offset, block_table=block_table, dequant_scale1=dequant_scale1,
                   quant_scale1=quant_scale1, dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
                   quant_offset2=quant_offset2, kv_padding_size=kv_padding_size, num_heads=num_heads,
                   scale=scale_value, input_layout=input_layout, num_key_value_heads=num_key_value_heads,
                   block_size=block_size, inner_precise=inner_precise)
    return out


def npu_prompt_flash_attention(
    query: Tensor, key: Tensor, value: Tensor, *, padding_mask=None, atten_mask=None, pse_shift=None,
    actual_seq_lengths=None, deq_scale1=None, quant_scale1=None, deq_scale2=None, quant_scale2=None,
    quant_offset2=None, num_heads=1, scale_value=1.0, pre_tokens=INT32_MAX, next_tokens=0, input_layout="BSH",
    num_key_value_heads=0, actual_seq_lengths_kv=None, sparse_mode=0,
) -> Tensor:
    """torch_npu.npu_prompt_flash_attention (spec 13.4, aclnn PFA V3): prefill. next_tokens
    defaults to 0; sparse_mode 10-14 is torch_npu's encoding of modes 0-4 at inner_precise 0 (the
    same result here); padding_mask is reserved upstream (ignored)."""
    inner_precise = 1
    if 10 <= sparse_mode <= 14:
        sparse_mode, inner_precise = sparse_mode - 10, 0
    out, _ = _call(query, key, value, atten_mask=atten_mask, pse_shift=pse_shift,
                   actual_seq_lengths=actual_seq_lengths, actual_seq_lengths_kv=actual_seq_lengths_kv,
                   dequant_scale1=deq_scale1, quant_scale1=quant_scale1, dequant_scale2=deq_scale2,
                   quant_scale2=quant_scale2, quant_offset2=quant_offset2, num_heads=num_heads, scale=scale_value,
                   pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
                   num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode, inner_precise=inner_precise)
    return out


# ---------------------------------------------------------------------------------------------
# flash-attn


def _append_slots(cache: Tensor, new: Tensor, seqlens: List[int], block_table: Optional[Tensor],
                  batch_idx: Optional[List[int]]) -> List[tuple]:
    """Where new[b, i] goes: position seqlens[b] + i of sequence b of the cache, as (cache index,
    positions) per b. Every slot is checked before anything is written, so that a bad call leaves the
    cache as it was (a negative index would otherwise wrap around to another sequence's tokens)."""
    if new.dim() != 4 or new.shape[0] != len(seqlens) or new.shape[2:] != cache.shape[2:]:
        raise ValueError(f"k/v: shape {tuple(new.shape)}: must be (batch {len(seqlens)}, seqlen_new, "
                         f"{cache.shape[2]} kv heads, head_dim {cache.shape[3]})")
    slots = []
    for b in range(new.shape[0]):
        pos = torch.arange(seqlens[b], seqlens[b] + new.shape[1])
        if block_table is None:
            row = b if batch_idx is None else batch_idx[b]
            if pos.numel() and int(pos[-1]) >= cache.shape[1]:
                raise ValueError(f"k/v: {new.shape[1]} new tokens at cache_seqlens[{b}] = {seqlens[b]} overflow the "
                                 f"cache's {cache.shape[1]} positions")
            slots.append((row, pos))
        else:
            bs = cache.shape[1]
            if pos.numel() and int(pos[-1]) // bs >= block_table.shape[1]:
                raise ValueError(f"k/v: {new.shape[1]} new tokens at cache_seqlens[{b}] = {seqlens[b]} overflow the "
                                 f"{block_table.shape[1]} blocks of block_table row {b}")
            blocks = block_table[b, pos // bs].long()
            bad = (blocks < 0) | (blocks >= cache.shape[0])
            if bool(bad.any()):
                column = int((pos // bs)[bad][0])
                raise ValueError(f"block_table[{b}][{column}] = {int(block_table[b, column])}: must be in "
                                 f"[0, {cache.shape[0]}) (the cache's blocks), for the new tokens of sequence {b}")
            slots.append((blocks, pos % bs))
    return slots


def flash_attn_with_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None, v: Optional[Tensor] = None,
    rotary_cos=None, rotary_sin=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
    block_table: Optional[Tensor] = None, softmax_scale: Optional[float] = None, causal: bool = False,
    window_size: Sequence[int] = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
    alibi_slopes=None, num_splits: int = 0, return_softmax_lse: bool = False,
):
    """flash-attn's flash_attn_with_kvcache on CPU tensors: q (B, S_q, H, D); k_cache/v_cache
    (B_cache, S_cache, H_k, D), or with block_table (num_blocks, page_block_size, H_k, D) pages and
    block_table (B, max_blocks) int32. k/v (B, S_new, H_k, D), when given, are written into the
    cache in place at cache_seqlens before attending. causal is aligned bottom-right (query row i
    sees the cache up to cache_seqlens + S_new - S_q + i); window_size (left, right) a band.
    Returns out (B, S_q, H, D), and softmax_lse (B, H, S_q) fp32 with return_softmax_lse."""
    for name, arg in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_leftpad", cache_leftpad),
                      ("alibi_slopes", alibi_slopes)):
        if arg is not None:
            raise NotImplementedError(f"{name}: not supported by attnops' flash_attn_with_kvcache yet (pass None)")
    if softcap != 0.0:
        raise NotImplementedError(f"softcap = {softcap}: not supported by attnops (pass 0.0)")
    if q.dim() != 4:
        raise ValueError(f"q: shape {tuple(q.shape)}: must be (batch, seqlen_q, heads, head_dim)")
    if (k is None) != (v is None):
        raise ValueError("k and v: pass both new key and value tensors, or neither")
    if block_table is not None and cache_batch_idx is not None:
        raise ValueError("cache_batch_idx: cannot be combined with block_table (flash-attn's rule)")
    batch, s_q, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    paged = block_table is not None
    if cache_seqlens is None:
        # flash-attn: the whole cache is the context; appending needs to know where.
        if paged or k is not None:
            raise ValueError("cache_seqlens: required with block_table or new k/v (how many tokens each sequence "
                             "has cached)")
        seqlens = [k_cache.shape[1]] * batch
    elif isinstance(cache_seqlens, int):
        seqlens = [cache_seqlens] * batch
    else:
        seqlens = [int(x) for x in (cache_seqlens.tolist() if isinstance(cache_seqlens, Tensor) else cache_seqlens)]
    if len(seqlens) != batch:
        raise ValueError(f"cache_seqlens: {len(seqlens)} entries for batch {batch}")
    for b, length in enumerate(seqlens):
        if length < 0:
            raise ValueError(f"cache_seqlens[{b}] = {length}: must be >= 0")
    batch_idx = None
    if cache_batch_idx is not None:
        batch_idx = [int(x) for x in torch.as_tensor(cache_batch_idx).reshape(-1).tolist()]
        if len(batch_idx) != batch:
            raise ValueError(f"cache_batch_idx: {len(batch_idx)} entries for batch {batch}")
        for b, row in enumerate(batch_idx):
            if not 0 <= row < k_cache.shape[0]:
                raise ValueError(f"cache_batch_idx[{b}] = {row}: must be in [0, {k_cache.shape[0]}) (k_cache's batch)")
    if k is not None:
        k_slots = _append_slots(k_cache, k, seqlens, block_table, batch_idx)
        v_slots = _append_slots(v_cache, v, seqlens, block_table, batch_idx)
        for cache, new, slots in ((k_cache, k, k_slots), (v_cache, v, v_slots)):
            for b, (index, pos) in enumerate(slots):
                cache[index, pos] = new[b]
        seqlens = [s + k.shape[1] for s in seqlens]
    key, value = k_cache, v_cache
    if batch_idx is not None:
        index = torch.tensor(batch_idx, dtype=torch.long)
        key, value = k_cache.index_select(0, index), v_cache.index_select(0, index)
    if paged:  # (num_blocks, block, H_k, D) is the BnBsH cache (num_blocks, block, H_k * D)
        key = key.reshape(key.shape[0], key.shape[1], kv_heads * key.shape[3])
        value = value.reshape(value.shape[0], value.shape[1], kv_heads * value.shape[3])
    scale = 1.0 / math.sqrt(dim) if softmax_scale is None else float(softmax_scale)
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    mask, sparse_mode, pre, nxt = None, 0, INT32_MAX, INT32_MAX
    if s_q == 1 and left >= 0:
        # Decode ignores sparse modes (upstream rule), so a sliding window becomes a [B,1,1,S] mask
        # of the keys older than `left` positions before the query (the last cached token).
        width = block_table.shape[1] * k_cache.shape[1] if paged else key.shape[1]
        cols = torch.arange(width).unsqueeze(0)
        mask = (cols < torch.tensor(seqlens).unsqueeze(1) - 1 - left).view(batch, 1, 1, width)
    elif s_q > 1 and (causal or left >= 0 or right >= 0):
        # Bottom-right causal (mode 3), or a bottom-right band (mode 4; -1 = unbounded), through
        # the compressed mask those modes take.
        mask = torch.triu(torch.ones(_COMPRESSED, _COMPRESSED, dtype=torch.bool), diagonal=1)
        if causal and left < 0:
            sparse_mode = 3
        else:
            sparse_mode, pre, nxt = 4, (left if left >= 0 else INT32_MAX), (right if right >= 0 else INT32_MAX)
    out, lse = _call(q, key, value, atten_mask=mask, block_table=block_table,
                     actual_seq_lengths=[s_q] * batch, actual_seq_lengths_kv=seqlens, num_heads=heads, scale=scale,
                     pre_tokens=pre, next_tokens=nxt, input_layout="BSND", num_key_value_heads=kv_heads,
                     sparse_mode=sparse_mode, block_size=k_cache.shape[1] if paged else 0,
                     softmax_lse_flag=return_softmax_lse)
    if return_softmax_lse:
        return out, lse.squeeze(-1)
    return out
