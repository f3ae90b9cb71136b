"""Context parallelism on torch.distributed: one attention spread over the processes of a group,
each holding a shard of the sequence (gloo on CPU; the code assumes no device except in the
attnops kernel call, so NCCL can follow with a GPU backend).

Three ways to move data (``comm=``):
- ``"ring"``: K/V blocks travel around the ring with ``batch_isend_irecv``, double-buffered: the
  transfer of step s+1 is posted before the block of step s is computed. Partial results merge
  in fp32 by their softmax statistics (attnops.torch.merge). The backward sends K/V around again
  and the fp32 dK/dV accumulators one hop behind them (fixed layouts: the kernel adds each
  block's gradients straight into them, accumulateGrads); they come home after W hops.
- ``"allgather"`` (Llama 3 style): all-gather K/V, one kernel call per local query chunk over the
  key prefix it needs (bottom-right causal), no merge; dK/dV go back by a reduce-scatter (an
  all-to-all and a sum in rank order, so the result does not depend on the backend's reduction
  order).
- ``"ulysses"``: all-to-all from sequence shards to head shards, the plain op over the whole
  sequence for N/W heads, all-to-all back (K/V heads are repeated when Nk is not divisible by W).

Sharding (``scheme=``): ``"zigzag"`` cuts the sequence into 2W chunks and gives rank r chunks r
and 2W-1-r (every rank then does the same causal work); ``"contiguous"`` gives rank r the r-th of
W equal pieces. :func:`shard` / :func:`unshard` move tensors between the two views.

Numerics: ring and all-gather call the kernels on the input dtype through the extended entry
points, which write partial outputs and gradients in fp32 (statistics are fp32 anyway); merges and
sums are fp32 and the result is cast once at the end, so a bf16/fp16 run is at least as accurate
as the single-process op, at the half kernels' speed.

Dropout (keep_prob < 1 / dropout_p > 0): the kernels key the Philox counter by global positions
(sequence, head, query position, key position), so every W and comm draws exactly the bits the
single-process op draws for the global problem with the same seed; the seed is rank 0's,
broadcast to the group. With W = 1 every entry point is the plain op itself (bit
for bit). Results are bitwise reproducible run to run at a given W: every sum has a fixed order.

Supported now: layouts BSND, BNSD, BSH, SBH, and TND (packed sequences, each sharded on its own;
whole sequences per rank with ``scheme="whole"``, balanced by work, no communication; or
``scheme="llama3"``, contiguous slices of the packed token stream, sequences cut anywhere, any T:
rank r holds tokens [floor(rT/W), floor((r+1)T/W)));
self-attention, and cross-attention shards (global S1 != S2, every comm and the hybrid, every
sparse mode, explicit masks, pse; TND with ``cu_seqlens_kv``, per-sequence query and key lengths,
schemes zigzag, contiguous, llama3, and whole: keys on their queries' rank, shard(..., assign_by=));
the compressed 1024-row alibi pse form (each block's bias expanded from its global positions);
GQA/MQA; Dv != D. No mask or causal take the paths below; sparse modes 0-8 (bands, prefixes, TND
modes 7/8, explicit global masks), learnable sinks, pse (alibi slopes on global positions, dense
global bias), the Ulysses-inside, ring-across hybrid (``ulysses_group=``), "llama3" and
cross-attention take the block-wise path of attnops.torch._cp_general, whose ring stops after
the last step with work. Dropout is keyed by global positions everywhere (keep bits equal to the
single-process op's for the same seed).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _ops
from . import _cp_general as gen
# Shared with the block-wise path; CommStats and comm_stats stay importable from here (cp.comm_stats).
from ._cp_common import CommStats, comm_stats  # noqa: F401
from ._cp_common import ReplicatedGrad, _HeadsToSeq, _Ring, _SeqToHeads, _heads_to_seq, _pack, _unpack
from .merge import merge_max_sum, tnd_stats_from_token_major
from .flash_attn import _CAUSAL_MASK
from .flash_attn import flash_attn_func as _plain_flash_attn_func
from .flash_attn import flash_attn_varlen_func as _plain_flash_attn_varlen_func
from .npu import draw_seed
from .npu import npu_fusion_attention as _plain_npu_fusion_attention

INT32_MAX = _ops.INT32_MAX
SCHEMES = ("zigzag", "contiguous", "llama3")
COMMS = ("ring", "allgather", "ulysses")
# The sequence axis of each supported layout.
SEQ_DIM = {"BSND": 1, "BNSD": 2, "BSH": 1, "SBH": 0}


# ---------------------------------------------------------------------------------------------
# Group and sharding


def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized: call torch.distributed.init_process_group "
                           "first")
    g = group if group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(g), dist.get_rank(g)
    if rank < 0:
        raise ValueError("group: this process is not a member of the given process group")
    return g, world, rank


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme = {scheme!r}: must be one of {', '.join(SCHEMES)}")


def _lengths(cu_seqlens, total: int) -> list:
    """Per-sequence lengths from cumulative lengths (CANN style without a leading 0, or
    flash-attn style with one: a leading 0 is an empty first sequence, which changes nothing)."""
    cum = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    if any(b < a for a, b in zip(cum, cum[1:])) or (cum and cum[0] < 0) or (cum[-1] if cum else 0) != total:
        raise ValueError(f"cu_seqlens = {cum}: must be non-decreasing cumulative lengths ending at the sequence "
                         f"length {total}")
    return [b - a for a, b in zip([0] + cum[:-1], cum)]


def _shard_one(seq_len: int, world: int, rank: int, scheme: str, device, what: str = "sequence length") -> Tensor:
    parts = 2 * world if scheme == "zigzag" else world
    if seq_len % parts:
        raise ValueError(f"{what} {seq_len}: must be divisible by {parts} for scheme {scheme!r} with {world} ranks "
                         "(pad the sequence)")
    c = seq_len // parts
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    if scheme == "contiguous":
        return first
    last = parts - 1 - rank
    return torch.cat([first, torch.arange(last * c, (last + 1) * c, device=device)])


def shard_index(seq_len: int, world_size: int, rank: int, scheme: str = "zigzag", device=None, *,
                cu_seqlens=None) -> Tensor:
    """Global sequence positions held by ``rank`` (int64, in local order). With ``cu_seqlens``
    (packed sequences, TND; cumulative lengths with or without a leading 0) every sequence is
    sharded on its own and the rank holds its share of each, sequence after sequence; with
    scheme "llama3" the rank holds the rank-th of W slices of the packed token stream,
    [floor(r*T/W), floor((r+1)*T/W)) (sequences cut at arbitrary points; any T: when W does not
    divide T the slices differ by at most one token, the last ranks holding the longer ones)."""
    _check_scheme(scheme)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank = {rank}, world_size = {world_size}: need 0 <= rank < world_size")
    if scheme == "llama3":  # a contiguous slice of the (packed) stream: sequences cut anywhere
        if cu_seqlens is not None:
            _lengths(cu_seqlens, seq_len)
            a, b = _llama3_slice(seq_len, world_size, rank)
            return torch.arange(a, b, device=device)
        return _shard_one(seq_len, world_size, rank, "contiguous", device, "sequence length")
    if cu_seqlens is None:
        return _shard_one(seq_len, world_size, rank, scheme, device)
    parts, start = [], 0
    for i, n in enumerate(_lengths(cu_seqlens, seq_len)):
        parts.append(_shard_one(n, world_size, rank, scheme, device, f"length of sequence {i}") + start)
        start += n
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def _no_assign_by(assign_by, scheme: str) -> None:
    if assign_by is not None:
        raise ValueError(f"assign_by: given with scheme {scheme!r}: only scheme 'whole' places a tensor by other "
                         "lengths (the keys/values of cross-attention by their queries' sequences)")


def _llama3_slice(total: int, world: int, rank: int):
    """[a, b): the tokens of the packed stream rank ``rank`` holds under scheme "llama3" (uneven
    by at most one token when ``world`` does not divide ``total``)."""
    return rank * total // world, (rank + 1) * total // world


def _held(seq_len: int, world: int, scheme: str, device, cu_seqlens=None) -> Tensor:
    """Global positions of the rows of all ranks concatenated rank by rank."""
    return torch.cat([shard_index(seq_len, world, j, scheme, device, cu_seqlens=cu_seqlens) for j in range(world)])


def shard(x: Tensor, group=None, *, seq_dim: int, scheme: str = "zigzag", cu_seqlens=None,
          ulysses_group=None, assign_by=None) -> Tensor:
    """This rank's shard of a global tensor (no communication). With ``ulysses_group`` (the
    hybrid) the shards follow the flat order: ring rank (in ``group``) * inner size + rank in
    ``ulysses_group``. scheme="whole": whole packed sequences (:func:`shard_whole`; ``assign_by``:
    the queries' cumulative lengths, which place the keys/values of cross-attention)."""
    if scheme == "whole":
        return shard_whole(x, group, cu_seqlens=cu_seqlens, seq_dim=seq_dim, assign_by=assign_by)
    _no_assign_by(assign_by, scheme)
    *_, world, rank = _flat(group, ulysses_group)
    return x.index_select(seq_dim, shard_index(x.shape[seq_dim], world, rank, scheme, x.device,
                                               cu_seqlens=cu_seqlens))


def unshard(x: Tensor, group=None, *, seq_dim: int, scheme: str = "zigzag", cu_seqlens=None,
            ulysses_group=None, assign_by=None) -> Tensor:
    """The global tensor from every rank's shard (an all-gather; every rank gets it)."""
    if scheme == "whole":
        return unshard_whole(x, group, cu_seqlens=cu_seqlens, seq_dim=seq_dim, assign_by=assign_by)
    _no_assign_by(assign_by, scheme)
    g, world, _, inner, fw, fr = _flat(group, ulysses_group)
    counts = None
    local = x.contiguous()
    if scheme == "llama3" and cu_seqlens is not None:  # slices may differ by a token: pad to the longest
        total = _cum_list(cu_seqlens)[-1] if len(cu_seqlens) else 0
        counts = [b - a for a, b in (_llama3_slice(total, fw, j) for j in range(fw))]
        if x.shape[seq_dim] != counts[fr]:
            raise ValueError(f"x: {x.shape[seq_dim]} rows along seq_dim {seq_dim}: rank {fr} holds {counts[fr]} "
                             f"tokens of the packed stream of {total} under scheme 'llama3'")
        pad = list(local.shape)
        pad[seq_dim] = max(counts) - counts[fr]
        local = torch.cat([local, local.new_zeros(pad)], seq_dim)
    if inner is not None:  # gather inside the inner group first, then across: flat order
        inner_parts = [torch.empty_like(local) for _ in range(inner[1])]
        dist.all_gather(inner_parts, local, group=inner[0])
        local = torch.cat(inner_parts, seq_dim)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local, group=g)
    full = torch.cat(parts, seq_dim)
    if counts is not None:
        rows = full.shape[seq_dim] // fw
        full = torch.cat([full.narrow(seq_dim, j * rows, n) for j, n in enumerate(counts)], seq_dim)
    return full.index_select(seq_dim, torch.argsort(_held(full.shape[seq_dim], fw, scheme, x.device, cu_seqlens)))


# ---------------------------------------------------------------------------------------------
# Kernel calls (BSND views; the only place that needs attnops' CPU kernels)


class _Dropout(NamedTuple):
    """Dropout under context parallelism: the keep bits are those of the global problem (the
    kernels key the Philox counter by global positions, attnops/flash_attention_score_ex.h), so
    every W draws what the single-process op draws with the same (seed, offset)."""

    keep_prob: float
    seed: int
    offset: int
    heads: int  # global N
    seq_len: int  # fixed layouts: global S (TND: 0)
    cum: Optional[Tensor] = None  # TND: global cumulative lengths (no leading 0)

    def geometry(self, q_pos: Tensor, kv_pos: Tensor, seq_index=None, head_offset: int = 0):
        """The drop argument of _attn/_attn_grad for rows at global positions q_pos / kv_pos
        (within their sequences)."""
        geo = _ops.DropoutGeometry(head_num=self.heads, head_offset=head_offset, q_seq_len=self.seq_len,
                                   kv_seq_len=self.seq_len, q_rows=q_pos, kv_rows=kv_pos, actual_seq_qlen=self.cum,
                                   actual_seq_kvlen=self.cum, seq_index=seq_index)
        return self.keep_prob, self.seed, self.offset, geo


def _positions(seq_len: int, world: int, rank: int, scheme: str, device, lengths=None) -> Tensor:
    """Global position, within its sequence, of each local row of ``rank``."""
    if lengths is None:
        return shard_index(seq_len, world, rank, scheme, device)
    cum = _cum(lengths, device)
    pos = shard_index(int(cum[-1]) if len(lengths) else 0, world, rank, scheme, device, cu_seqlens=cum)
    return pos - (cum - torch.tensor(lengths, dtype=torch.int64, device=device))[torch.searchsorted(cum, pos, right=True)]


def _rows_of(pos: Tensor, rows) -> Tensor:
    return pos[rows] if isinstance(rows, slice) else pos.index_select(0, rows)


def _attn(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, q_cum=None, kv_cum=None, drop=None):
    """(out, max, sum), out fp32 whatever the input dtype (the extended entry point: bf16/fp16
    inputs run the half kernels), the statistics as [B,S,N,1] fp32. causal = bottom-right. With
    q_cum and kv_cum (packed sequences: B = 1, cumulative lengths) the call is TND, per sequence.
    drop: _Dropout.geometry(...) or None."""
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    keep, seed, offset, geo = drop if drop is not None else (1.0, 0, 0, None)
    if q_cum is not None:
        out, mx, sm = _ops.flash_attention_score_ex(q[0], k[0], v[0], mask, q_cum, kv_cum, scale, keep, INT32_MAX, nxt,
                                                    q.shape[2], "TND", mode, seed, offset, out_dtype=torch.float32,
                                                    drop=geo)
        return out[None], mx[None, ..., :1], sm[None, ..., :1]
    out, mx, sm = _ops.flash_attention_score_ex(q, k, v, mask, None, None, scale, keep, INT32_MAX, nxt, q.shape[2],
                                                "BSND", mode, seed, offset, out_dtype=torch.float32, drop=geo)
    return out, mx[..., :1].transpose(1, 2), sm[..., :1].transpose(1, 2)


def _attn_grad(q, k, v, dout, mx, sm, out, causal: bool, scale: float, q_cum=None, kv_cum=None, drop=None,
               acc=None):
    """fp32 (dq, dk, dv) from the global statistics mx/sm ([B,S,N,1]) and the global fp32 output;
    q/k/v/dout in the input dtype. acc: fp32 (dq, dk, dv) views (fixed layouts) that the kernel
    adds the gradients into (accumulateGrads: no gradient tensors allocated, no separate sum);
    then None is returned."""
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    keep, seed, offset, geo = drop if drop is not None else (1.0, 0, 0, None)
    f32 = torch.float32
    if acc is not None:
        stats = [x.transpose(1, 2).contiguous() for x in (mx, sm)]
        _ops.flash_attention_score_grad_ex(q, k, v, dout, mask, stats[0], stats[1], out, None, None, scale, keep,
                                           INT32_MAX, nxt, q.shape[2], "BSND", mode, seed, offset, dq=acc[0],
                                           dk=acc[1], dv=acc[2], accumulate=True, drop=geo)
        return None
    if q_cum is not None:
        dq, dk, dv, _ = _ops.flash_attention_score_grad_ex(q[0], k[0], v[0], dout[0], mask, mx[0].contiguous(),
                                                           sm[0].contiguous(), out[0], q_cum, kv_cum, scale, keep,
                                                           INT32_MAX, nxt, q.shape[2], "TND", mode, seed, offset,
                                                           grad_dtype=f32, drop=geo)
        return dq[None], dk[None], dv[None]
    stats = [x.transpose(1, 2).contiguous() for x in (mx, sm)]
    dq, dk, dv, _ = _ops.flash_attention_score_grad_ex(q, k, v, dout, mask, stats[0], stats[1], out, None, None, scale,
                                                       keep, INT32_MAX, nxt, q.shape[2], "BSND", mode, seed, offset,
                                                       grad_dtype=f32, drop=geo)
    return dq, dk, dv


# Rows along the sequence axis (1): a slice, or an index tensor (per-sequence chunks of packed
# sequences; the indices are distinct, so index_add_ adds each once).
def _take(t: Tensor, rows) -> Tensor:
    return t[:, rows] if isinstance(rows, slice) else t.index_select(1, rows)


def _put(t: Tensor, rows, value: Tensor) -> None:
    if isinstance(rows, slice):
        t[:, rows] = value
    else:
        t.index_copy_(1, rows, value)


def _add(t: Tensor, rows, value: Tensor) -> None:
    if isinstance(rows, slice):
        t[:, rows] += value
    else:
        t.index_add_(1, rows, value)


# ---------------------------------------------------------------------------------------------
# Ring


def _ring_block(scheme: str, causal: bool, rank: int, src: int, s_local: int, world: int, lengths=None,
                device=None):
    """(local query rows, rows of src's K/V, causal, query cumulative lengths, key cumulative
    lengths) of the step that holds rank src's K/V, or None when no query of this rank sees any
    of those keys. The lengths are None except for packed sequences (``lengths``), where every
    sequence contributes its own chunks and the rows are index tensors."""
    full = slice(0, s_local)
    local_cum = half_cum = None
    if lengths is not None and scheme == "contiguous":
        local_cum = _cum([n // world for n in lengths], device)
    elif lengths is not None:  # zigzag: every sequence's two local chunks, c rows each
        c = [n // (2 * world) for n in lengths]
        local_cum, half_cum = _cum([2 * x for x in c], device), _cum(c, device)
        starts = [int(x) - 2 * n for x, n in zip(local_cum.tolist(), c)]
        first = torch.cat([torch.arange(a, a + n, device=device) for a, n in zip(starts, c)])
        second = first + torch.tensor(c, device=device).repeat_interleave(torch.tensor(c, device=device))
    else:
        first, second = slice(0, s_local // 2), slice(s_local // 2, s_local)
    if not causal:
        return full, full, False, local_cum, local_cum
    if src == rank:
        return full, full, True, local_cum, local_cum
    if scheme == "contiguous":
        return (full, full, False, local_cum, local_cum) if src < rank else None
    # zigzag: this rank holds chunks (rank, 2W-1-rank) (of every sequence), src (src, 2W-1-src).
    if src < rank:  # both local chunks come after src's first chunk and before its second
        return full, first, False, local_cum, half_cum
    return second, full, False, half_cum, local_cum  # only the second local chunk sees src's chunks


# The ring backward of fixed layouts lets the kernel add into the fp32 accumulators
# (accumulateGrads) instead of returning per-block gradients that are then added; False: the
# latter (kept for the before/after measurement in bench/cp_bench.py --no-accumulate).
_RING_ACCUMULATE = True


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, scheme, g, world, rank, lengths=None, dropout=None):
        ring = _Ring(g, world, rank)
        b, s, n, _ = q.shape
        out = q.new_zeros((b, s, n, v.shape[3]), dtype=torch.float32)
        mx = q.new_full((b, s, n, 1), -math.inf, dtype=torch.float32)
        sm = q.new_zeros((b, s, n, 1), dtype=torch.float32)
        cur = _pack(k, v)
        nxt = torch.empty_like(cur)
        for step in range(world):
            reqs = ring.start(cur, nxt, "kv") if step + 1 < world else []
            block = _ring_block(scheme, causal, rank, (rank - step) % world, s, world, lengths, q.device)
            if block is not None:
                qr, kr, blk_causal, q_cum, kv_cum = block
                kk, vv = _unpack(cur, k.shape, v.shape)
                o, m, l = _attn(_take(q, qr), _take(kk, kr), _take(vv, kr), blk_causal, scale, q_cum, kv_cum,
                                _ring_drop(dropout, s, world, rank, (rank - step) % world, scheme, lengths, qr, kr))
                for t, new in zip((out, mx, sm), merge_max_sum(_take(out, qr), _take(mx, qr), _take(sm, qr), o, m, l)):
                    _put(t, qr, new)
            _Ring.wait(reqs)
            cur, nxt = nxt, cur
        ctx.save_for_backward(q, k, v, out, mx, sm)
        ctx.cfg = (scale, causal, scheme, g, world, rank, lengths, dropout)
        ctx.mark_non_differentiable(mx, sm)
        return out.to(q.dtype), mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm = ctx.saved_tensors
        scale, causal, scheme, g, world, rank, lengths, dropout = ctx.cfg
        ring = _Ring(g, world, rank)
        s = q.shape[1]
        dout = dout.to(q.dtype)
        dq = torch.zeros_like(q, dtype=torch.float32)
        cur = _pack(k, v)
        nxt = torch.empty_like(cur)
        # dK/dV of the block held at a step: this rank's share is computed into `local`, the
        # shares of the ranks that held the block before arrive in `acc[1]`; their sum travels on.
        local = q.new_empty(cur.shape, dtype=torch.float32)
        acc = [torch.zeros_like(local), torch.zeros_like(local)]
        dkv_reqs = []
        for step in range(world):
            kv_reqs = ring.start(cur, nxt, "kv") if step + 1 < world else []
            local.zero_()
            block = _ring_block(scheme, causal, rank, (rank - step) % world, s, world, lengths, q.device)
            if block is not None and _RING_ACCUMULATE and lengths is None:
                # Fixed layouts: the kernel adds into this rank's dQ and the travelling block's dK/dV.
                qr, kr, blk_causal, _, _ = block
                kk, vv = _unpack(cur, k.shape, v.shape)
                lk, lv = _unpack(local, k.shape, v.shape)
                _attn_grad(q[:, qr], kk[:, kr], vv[:, kr], dout[:, qr], mx[:, qr], sm[:, qr], out[:, qr], blk_causal,
                           scale, drop=_ring_drop(dropout, s, world, rank, (rank - step) % world, scheme, lengths, qr,
                                                  kr), acc=(dq[:, qr], lk[:, kr], lv[:, kr]))
            elif block is not None:
                qr, kr, blk_causal, q_cum, kv_cum = block
                kk, vv = _unpack(cur, k.shape, v.shape)
                dq_b, dk_b, dv_b = _attn_grad(_take(q, qr), _take(kk, kr), _take(vv, kr), _take(dout, qr),
                                              _take(mx, qr), _take(sm, qr), _take(out, qr), blk_causal, scale, q_cum,
                                              kv_cum, _ring_drop(dropout, s, world, rank, (rank - step) % world,
                                                                 scheme, lengths, qr, kr))
                _add(dq, qr, dq_b)
                lk, lv = _unpack(local, k.shape, v.shape)
                _add(lk, kr, dk_b)
                _add(lv, kr, dv_b)
            _Ring.wait(dkv_reqs)
            send = acc[1] if step > 0 else acc[0]
            if step > 0:
                send += local
            else:
                send.copy_(local)
            recv = acc[0] if send is acc[1] else acc[1]
            dkv_reqs = ring.start(send, recv, "dkv")
            _Ring.wait(kv_reqs)
            cur, nxt = nxt, cur
            acc = [send, recv]
        _Ring.wait(dkv_reqs)  # the last hop brings this rank's own dK/dV home
        dk, dv = _unpack(acc[1], k.shape, v.shape)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None, None


def _ring_drop(dropout, s_local: int, world: int, rank: int, src: int, scheme: str, lengths, qr, kr):
    """The drop argument of a ring step: this rank's rows qr against src's rows kr."""
    if dropout is None:
        return None
    q_pos = _positions(s_local * world, world, rank, scheme, None, lengths)
    kv_pos = _positions(s_local * world, world, src, scheme, None, lengths)
    return dropout.geometry(_rows_of(q_pos, qr), _rows_of(kv_pos, kr))


# ---------------------------------------------------------------------------------------------
# All-gather K/V


def _query_chunks(scheme: str, causal: bool, world: int, rank: int, s_local: int):
    """(local query rows, end of the global key prefix they need, causal) per kernel call."""
    s = s_local * world
    if not causal:
        return [(slice(0, s_local), s, False)]
    if scheme == "contiguous":
        return [(slice(0, s_local), (rank + 1) * s_local, True)]
    c = s_local // 2
    return [(slice(0, c), (rank + 1) * c, True), (slice(c, s_local), (2 * world - rank) * c, True)]


def _all_gather_kv(k, v, g, world, scheme, cu_seqlens=None):
    """Global K and V (input dtype, global sequence order; sequence axis 1) from every rank's shard."""
    local = _pack(k, v)
    gathered = local.new_empty(world * local.numel())  # gloo wants the flat form
    comm_stats.record("allgather_kv", local)
    t0 = time.perf_counter()
    dist.all_gather_into_tensor(gathered, local, group=g)
    comm_stats.wait_s += time.perf_counter() - t0
    gathered = gathered.view(world, -1)
    ks, vs = zip(*(_unpack(gathered[j], k.shape, v.shape) for j in range(world)))
    order = torch.argsort(_held(k.shape[1] * world, world, scheme, k.device, cu_seqlens))
    return torch.cat(ks, 1).index_select(1, order), torch.cat(vs, 1).index_select(1, order)


def _reduce_scatter(dkg: Tensor, dvg: Tensor, k: Tensor, v: Tensor, g, world: int, scheme: str, cu_seqlens=None):
    """This rank's fp32 dK/dV from every rank's global-sized fp32 dK/dV (sequence axis 1): each
    rank's share of each shard exchanged all-to-all, summed in rank order (so the result does not
    depend on the backend's reduction order)."""
    held = _held(dkg.shape[1], world, scheme, dkg.device, cu_seqlens)
    dk_parts = dkg.index_select(1, held).chunk(world, 1)
    dv_parts = dvg.index_select(1, held).chunk(world, 1)
    send = torch.stack([_pack(a, b) for a, b in zip(dk_parts, dv_parts)])
    recv = torch.empty_like(send)
    comm_stats.record("reduce_scatter_dkv", send)
    t0 = time.perf_counter()
    dist.all_to_all_single(recv, send, group=g)
    comm_stats.wait_s += time.perf_counter() - t0
    total = recv[0].clone()
    for j in range(1, world):
        total += recv[j]
    return _unpack(total, k.shape, v.shape)



class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, scheme, g, world, rank, dropout=None):
        kg, vg = _all_gather_kv(k, v, g, world, scheme)
        b, s, n, _ = q.shape
        out = q.new_empty((b, s, n, v.shape[3]), dtype=torch.float32)
        mx = q.new_empty((b, s, n, 1), dtype=torch.float32)
        sm = torch.empty_like(mx)
        for rows, end, blk_causal in _query_chunks(scheme, causal, world, rank, s):
            out[:, rows], mx[:, rows], sm[:, rows] = _attn(q[:, rows], kg[:, :end], vg[:, :end], blk_causal, scale,
                                                           drop=_gather_drop(dropout, s, world, rank, scheme, rows, end))
        ctx.save_for_backward(q, k, v, out, mx, sm)
        ctx.cfg = (scale, causal, scheme, g, world, rank, dropout)
        ctx.mark_non_differentiable(mx, sm)
        return out.to(q.dtype), mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm = ctx.saved_tensors
        scale, causal, scheme, g, world, rank, dropout = ctx.cfg
        kg, vg = _all_gather_kv(k, v, g, world, scheme)  # gathered again rather than kept: W x less memory
        dout = dout.to(q.dtype)
        dq = torch.empty_like(q, dtype=torch.float32)
        dkg, dvg = torch.zeros_like(kg, dtype=torch.float32), torch.zeros_like(vg, dtype=torch.float32)
        for rows, end, blk_causal in _query_chunks(scheme, causal, world, rank, q.shape[1]):
            dq[:, rows], dk_b, dv_b = _attn_grad(q[:, rows], kg[:, :end], vg[:, :end], dout[:, rows], mx[:, rows],
                                                 sm[:, rows], out[:, rows], blk_causal, scale,
                                                 drop=_gather_drop(dropout, q.shape[1], world, rank, scheme, rows, end))
            dkg[:, :end] += dk_b
            dvg[:, :end] += dv_b
        dk, dv = _reduce_scatter(dkg, dvg, k, v, g, world, scheme)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def _gather_drop(dropout, s_local: int, world: int, rank: int, scheme: str, rows, end: int):
    """The drop argument of an all-gather call: this rank's rows against the global key prefix."""
    if dropout is None:
        return None
    q_pos = _positions(s_local * world, world, rank, scheme, None)
    return dropout.geometry(_rows_of(q_pos, rows), torch.arange(end))


def _varlen_pairs(lengths, scheme: str, causal: bool, world: int, rank: int, device):
    """Packed sequences: per (sequence, local chunk) in local row order, the chunk's length and
    the global key rows it needs (a prefix of its sequence when causal, all of it otherwise).
    Returns (query lengths, key row index, key lengths)."""
    parts = 2 * world if scheme == "zigzag" else world
    q_lens, kv_rows, kv_lens, start = [], [], [], 0
    for n in lengths:
        c = n // parts
        for chunk in ([rank] if scheme == "contiguous" else [rank, parts - 1 - rank]):
            end = start + ((chunk + 1) * c if causal else n)
            q_lens.append(c)
            kv_lens.append(end - start)
            kv_rows.append(torch.arange(start, end, device=device))
        start += n
    return q_lens, torch.cat(kv_rows), kv_lens


def _cum(lens, device) -> Tensor:
    return torch.tensor(lens, dtype=torch.int64, device=device).cumsum(0)


class _AllGatherVarlen(torch.autograd.Function):
    """TND: all-gather K/V, then one kernel call in which every (sequence, local chunk) pair is a
    packed sequence of its own with the keys it needs (bottom-right causal when causal)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, scheme, g, world, rank, lengths, dropout=None):
        cum = _cum(lengths, q.device)
        kg, vg = (t[0] for t in _all_gather_kv(k[None], v[None], g, world, scheme, cum))
        q_lens, kv_rows, kv_lens = _varlen_pairs(lengths, scheme, causal, world, rank, q.device)
        aq, ak = _cum(q_lens, q.device), _cum(kv_lens, q.device)
        drop = _varlen_drop(dropout, lengths, world, rank, scheme, kv_rows, cum)
        out, mx, sm = _attn(q[None], kg.index_select(0, kv_rows)[None], vg.index_select(0, kv_rows)[None], causal,
                            scale, aq, ak, drop)
        out, mx, sm = out[0], mx[0].contiguous(), sm[0].contiguous()
        ctx.save_for_backward(q, k, v, out, mx, sm, kv_rows, aq, ak, cum)
        ctx.cfg = (scale, causal, scheme, g, world, rank, lengths, dropout)
        ctx.mark_non_differentiable(mx, sm)
        return out.to(q.dtype), mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm, kv_rows, aq, ak, cum = ctx.saved_tensors
        scale, causal, scheme, g, world, rank, lengths, dropout = ctx.cfg
        kg, vg = (t[0] for t in _all_gather_kv(k[None], v[None], g, world, scheme, cum))
        drop = _varlen_drop(dropout, lengths, world, rank, scheme, kv_rows, cum)
        dq, dkp, dvp = (t[0] for t in _attn_grad(q[None], kg.index_select(0, kv_rows)[None],
                                                  vg.index_select(0, kv_rows)[None], dout.to(q.dtype)[None], mx[None],
                                                  sm[None], out[None], causal, scale, aq, ak, drop))
        # A key row serves both local chunks of its sequence: index_add_ sums the two in row
        # order (deterministic on the CPU).
        dkg = torch.zeros_like(kg, dtype=torch.float32).index_add_(0, kv_rows, dkp)
        dvg = torch.zeros_like(vg, dtype=torch.float32).index_add_(0, kv_rows, dvp)
        dk, dv = _reduce_scatter(dkg[None], dvg[None], k[None], v[None], g, world, scheme, cum)
        return (dq.to(q.dtype), dk[0].to(k.dtype), dv[0].to(v.dtype)) + (None,) * 8


def _varlen_drop(dropout, lengths, world: int, rank: int, scheme: str, kv_rows: Tensor, cum: Tensor):
    """The drop argument of the packed all-gather call: every (sequence, local chunk) pair is a
    local sequence of its own (global sequence: its sequence), keys at their global positions."""
    if dropout is None:
        return None
    chunks = 1 if scheme == "contiguous" else 2
    seq_index = torch.arange(len(lengths)).repeat_interleave(chunks)
    starts = cum - torch.tensor(lengths, dtype=torch.int64)
    kv_pos = kv_rows.cpu() - starts[torch.searchsorted(cum, kv_rows.cpu(), right=True)]
    return dropout.geometry(_positions(0, world, rank, scheme, None, lengths), kv_pos, seq_index)


# ---------------------------------------------------------------------------------------------
# Ulysses


class _DropAttention(torch.autograd.Function):
    """The op over this rank's head group with dropout keyed by global positions (Ulysses with
    dropout): forward and backward through the extended entry points."""

    @staticmethod
    def forward(ctx, q, k, v, mask, cum, scale, nxt, layout, mode, drop):
        keep, seed, offset, geo = drop
        heads = q.shape[1] if layout == "TND" else q.shape[2]
        out, mx, sm = _ops.flash_attention_score_ex(q, k, v, mask, cum, cum, scale, keep, INT32_MAX, nxt, heads, layout,
                                                    mode, seed, offset, drop=geo)
        ctx.save_for_backward(q, k, v, out, mx, sm)
        ctx.cfg = (mask, cum, scale, nxt, heads, layout, mode, drop)
        ctx.mark_non_differentiable(mx, sm)
        return out, mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm = ctx.saved_tensors
        mask, cum, scale, nxt, heads, layout, mode, (keep, seed, offset, geo) = ctx.cfg
        dq, dk, dv, _ = _ops.flash_attention_score_grad_ex(q, k, v, dout.to(q.dtype), mask, mx, sm, out, cum, cum, scale,
                                                           keep, INT32_MAX, nxt, heads, layout, mode, seed, offset,
                                                           drop=geo)
        return (dq, dk, dv) + (None,) * 7


def _ulysses(q, k, v, scale, causal, scheme, g, world, rank, lengths=None, dropout=None):
    """q/k/v BSND (TND as B = 1 with ``lengths``, the packed sequences' lengths)."""
    n, nk = q.shape[2], k.shape[2]
    if n % world:
        raise ValueError(f"query heads {n}: must be divisible by the group size {world} for comm='ulysses'")
    dtype = q.dtype
    if nk % world:
        # Repeat K/V heads up to the query heads (n % nk == 0 is the kernel's GQA rule). The
        # repeated heads' gradients are summed by autograd: in fp32, so that they are rounded
        # once, as the kernel's own GQA sum is.
        q, k, v = (t.float().repeat_interleave(n // t.shape[2], dim=2) if t is not q else t.float()
                   for t in (q, k, v))
    qh, kh, vh = (_SeqToHeads.apply(t, g, world) for t in (q, k, v))
    order = None
    if causal or lengths is not None or dropout is not None:
        # The causal mask, packed sequences and dropout (keyed by global positions) need the
        # global order; a full mask does not care.
        cum = _cum(lengths, q.device) if lengths is not None else None
        inverse = _held(qh.shape[1], world, scheme, q.device, cum)  # global position of each rank-major row
        order = torch.argsort(inverse)
        qh, kh, vh = (t.index_select(1, order) for t in (qh, kh, vh))
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    if dropout is not None:
        drop = dropout.geometry(None, None, head_offset=rank * qh.shape[2])
        if lengths is None:
            out, mx, sm = _DropAttention.apply(qh, kh, vh, mask, None, scale, nxt, "BSND", mode, drop)
            stats = torch.cat([mx[..., :1], sm[..., :1]], 3).transpose(1, 2)
        else:
            out, mx, sm = _DropAttention.apply(qh[0], kh[0], vh[0], mask, cum, scale, nxt, "TND", mode, drop)
            out, stats = out[None], torch.cat([mx[..., :1], sm[..., :1]], 2)[None]
    elif lengths is None:
        out, mx, sm = _ops.flash_attention_score(qh, kh, vh, None, None, mask, None, None, None, None, None, None,
                                                 scale, 1.0, INT32_MAX, nxt, qh.shape[2], "BSND", 0, mode, 1, 0, 0)
        stats = torch.cat([mx[..., :1], sm[..., :1]], 3).transpose(1, 2)  # [B, S, N/W, 2]
    else:
        out, mx, sm = _ops.flash_attention_score(qh[0], kh[0], vh[0], None, None, mask, cum, cum, None, None, None,
                                                 None, scale, 1.0, INT32_MAX, nxt, qh.shape[2], "TND", 0, mode, 1, 0,
                                                 0)
        out, stats = out[None], torch.cat([mx[..., :1], sm[..., :1]], 2)[None]  # [1, T, N/W, 2]
    if order is not None:
        # Rank-major again: global position inverse[i] is the i-th row held by the ranks.
        out, stats = out.index_select(1, inverse), stats.index_select(1, inverse)
    stats = _heads_to_seq(stats.detach(), g, world)
    return _HeadsToSeq.apply(out, g, world).to(dtype), stats[..., :1], stats[..., 1:]


# ---------------------------------------------------------------------------------------------
# Entry points


def _bsnd(x: Tensor, layout: str, heads: int, name: str) -> Tensor:
    """A BSND view of x (no copy)."""
    if layout in ("BSND", "BNSD"):
        if x.dim() != 4:
            raise ValueError(f"{name}: rank {x.dim()} for input_layout {layout}: must be 4")
        return x if layout == "BSND" else x.transpose(1, 2)
    if x.dim() != 3:
        raise ValueError(f"{name}: rank {x.dim()} for input_layout {layout}: must be 3")
    h = x.shape[2]
    if heads <= 0 or h % heads:
        raise ValueError(f"{name}: hidden size {h}: must be a multiple of {heads} heads for input_layout {layout}")
    if layout == "BSH":
        return x.unflatten(2, (heads, h // heads))
    return x.unflatten(2, (heads, h // heads)).transpose(0, 1)


def _from_bsnd(x: Tensor, layout: str) -> Tensor:
    if layout == "BSND":
        return x
    if layout == "BNSD":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.flatten(2)
    return x.transpose(0, 1).flatten(2).contiguous()


def attention(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str, *, scale: float,
              causal: bool = False, group=None, comm: str = "ring", scheme: str = "zigzag", cu_seqlens=None,
              sparse_mode: Optional[int] = None, pre_tokens: int = INT32_MAX, next_tokens: int = INT32_MAX,
              atten_mask: Optional[Tensor] = None, prefix=None, sink: Optional[Tensor] = None,
              pse: Optional[Tensor] = None, pse_type: int = 1, ulysses_group=None,
              keep_prob: float = 1.0, seed: int = 0, offset: int = 0, cu_seqlens_kv=None, q_start_idx=None,
              kv_start_idx=None):
    """Attention over the global sequence, called with this rank's shards (held as ``scheme``
    says). Differentiable in query, key and value. Returns (out in the input layout, softmax_max,
    softmax_sum), the statistics fp32 [B, N, S_local] (TND: [T_local, N], token-major) of the
    whole sequence for this rank's rows. causal: self-attention, each global query sees keys at
    or before its position (per sequence for TND).

    TND (packed sequences): ``cu_seqlens`` gives the global cumulative lengths (with or without a
    leading 0); every sequence is sharded on its own (``shard(..., cu_seqlens=)``).
    ``cu_seqlens_kv`` (TND cross-attention): the keys' global cumulative lengths, one per query
    sequence, each key sequence sharded on its own by the same scheme (``shard(key, ...,
    cu_seqlens=cu_seqlens_kv)``); every sparse mode of the plain op (0-4, 6-8), the bottom-right
    modes shifted per sequence by that sequence's Skv - Sq. With ``scheme="whole"`` the sequences
    are assigned by the query lengths and the keys follow their queries (``shard(key, ...,
    scheme="whole", cu_seqlens=cu_seqlens_kv, assign_by=cu_seqlens)``).

    Masks beyond ``causal`` (``sparse_mode`` 0-8 with pre_tokens/next_tokens, prefix, an explicit
    global atten_mask: fixed layouts [S1, S2], [B, N|1, S1, S2], [1, 1, S1, S2]; TND [maxSq, maxSkv]
    or [T1, T2] of the global packed sequences), a learnable ``sink`` (fp32 [N], its gradient
    returned whole on every rank),
    ``pse`` (alibi slopes with pse_type 2/3 on global positions, offset by ``q_start_idx`` /
    ``kv_start_idx`` as in the plain op; a dense global bias with 0/1: fixed layouts [B|1, N,
    S1|1, S2], TND the flattened [sum N*Sq_i*Skv_i] or row-broadcast [sum N*Skv_i]) and
    the Ulysses-inside, ring-across hybrid (``ulysses_group``: the inner group; ``group``: the ring
    across; ranks in the flat order ring rank * inner size + inner rank, see :func:`shard`) take
    the block-wise path of attnops.torch._cp_general. ``sparse_mode`` there is the rule itself:
    modes 2-4 and 6-8 need no mask tensor; mode 0 without a mask is the band alone, mode 5 without
    one the causal-plus-prefix rule. ``scheme="whole"`` (TND): whole sequences per rank
    (:func:`assign_sequences`), no communication.

    Dropout (keep_prob < 1): the keep bits are those the single-process op draws for the global
    problem with the same (seed, offset), whatever W, comm and scheme (the block-wise path, the
    hybrid and scheme "whole" included); every rank must pass the same seed.

    Every rank of the group must call it with the same shapes and arguments."""
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"keep_prob = {keep_prob}: must be in (0, 1]")
    drop = (keep_prob, int(seed), int(offset))
    if scheme == "llama3" and input_layout != "TND":
        scheme = "contiguous"  # one sequence per batch row: the stream's slices are contiguous shards
    cross = _is_cross(query, key, input_layout)
    if cu_seqlens_kv is not None:
        if input_layout != "TND":
            raise ValueError(f"cu_seqlens_kv: given with input_layout {input_layout}: only TND takes it")
        if cu_seqlens is not None and _cum_list(cu_seqlens_kv) == _cum_list(cu_seqlens):
            cu_seqlens_kv = None  # self-attention lengths
        else:
            cross = True
    alibi_start = _start_idx(q_start_idx, kv_start_idx, pse, pse_type)
    if scheme == "whole":
        if ulysses_group is not None:
            raise ValueError("ulysses_group: given with scheme 'whole': whole sequences need no communication")
        return _whole_attention(query, key, value, head_num, input_layout, scale, causal, group, cu_seqlens,
                                sparse_mode, pre_tokens, next_tokens, prefix, sink, pse, pse_type, drop,
                                atten_mask, alibi_start, cu_seqlens_kv)
    if cross or (scheme == "llama3" and input_layout == "TND") or \
            _needs_general(sparse_mode, pre_tokens, next_tokens, atten_mask, prefix, sink, pse, pse_type, ulysses_group):
        return _general_attention(query, key, value, head_num, input_layout, scale, causal, group, comm, scheme,
                                  cu_seqlens, sparse_mode, pre_tokens, next_tokens, atten_mask, prefix, sink, pse,
                                  pse_type, ulysses_group, drop, cu_seqlens_kv, alibi_start)
    if sparse_mode is not None:
        causal = sparse_mode in (2, 3)
    g, world, rank = _group_info(group)
    checked = _checked(query, key, value, head_num, input_layout, comm, scheme, world, cu_seqlens)
    if input_layout == "TND":
        return _attention_tnd(query, key, value, head_num, scale, causal, g, world, rank, comm, scheme, checked, drop)
    q, k, v = checked
    if world == 1:
        out, mx, sm = _attn_plain(query, key, value, head_num, input_layout, scale, causal, drop)
        return out, mx, sm
    dropout = _Dropout(keep_prob, seed, offset, q.shape[2], q.shape[1] * world) if keep_prob < 1.0 else None
    if comm == "ring":
        out, mx, sm = _RingAttention.apply(q, k, v, scale, causal, scheme, g, world, rank, None, dropout)
    elif comm == "allgather":
        out, mx, sm = _AllGatherAttention.apply(q, k, v, scale, causal, scheme, g, world, rank, dropout)
    else:
        out, mx, sm = _ulysses(q, k, v, scale, causal, scheme, g, world, rank, None, dropout)
    return _from_bsnd(out, input_layout), mx[..., 0].transpose(1, 2), sm[..., 0].transpose(1, 2)


def _start_idx(q_start_idx, kv_start_idx, pse, pse_type: int):
    """(qStartIdx, kvStartIdx) of the alibi distance (element 0 of a list, as the plain op reads
    them); only with alibi slopes (pse_type 2/3), where they are the global problem's offsets."""
    vals = []
    for name, x in (("q_start_idx", q_start_idx), ("kv_start_idx", kv_start_idx)):
        if x is None:
            vals.append(0)
            continue
        if pse is None or pse_type not in (2, 3):
            raise ValueError(f"{name}: given with pse_type {pse_type}{'' if pse is not None else ' and no pse'}: only "
                             "alibi slopes (pse_type 2/3) use it")
        lst = [int(y) for y in (x.tolist() if isinstance(x, Tensor) else (x if isinstance(x, (list, tuple)) else [x]))]
        if not lst:
            raise ValueError(f"{name}: []: must hold at least one value (element 0 is used)")
        vals.append(lst[0])
    return vals[0], vals[1]


def _is_cross(query: Tensor, key: Tensor, layout: str) -> bool:
    """Fixed layouts: whether the key shard's sequence length differs from the query's."""
    dim = {"BSND": 1, "BNSD": 2, "BSH": 1, "SBH": 0}.get(layout)
    return dim is not None and query.dim() > dim and key.dim() > dim and query.shape[dim] != key.shape[dim]


def _checked(query, key, value, head_num, input_layout, comm, scheme, world, cu_seqlens, cross=False, rank=0):
    """Checks the arguments, before any communication (so that every rank fails alike, whatever
    W), and returns BSND views (q, k, v), or for TND the packed sequences' lengths. cross: the
    key/value shards may be longer or shorter than the query's (cross-attention)."""
    if comm not in COMMS:
        raise ValueError(f"comm = {comm!r}: must be one of {', '.join(COMMS)}")
    _check_scheme(scheme)
    if input_layout not in SEQ_DIM and input_layout != "TND":
        raise ValueError(f"input_layout = {input_layout!r}: must be one of {', '.join(SEQ_DIM)}, TND")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise ValueError(f"{name}: dtype {t.dtype}: must equal query's {query.dtype}")
    if input_layout == "TND":
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3:
                raise ValueError(f"{name}: rank {t.dim()} for input_layout TND: must be 3 ([T_local, N, D])")
        if not cross and (key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]):
            raise ValueError(f"key/value: local token counts {key.shape[0]}/{value.shape[0]}: must equal query's "
                             f"{query.shape[0]} (self-attention shards)")
        if cu_seqlens is None:
            raise ValueError("cu_seqlens: None: required for input_layout TND (the global cumulative sequence "
                             "lengths)")
        if scheme == "llama3":  # slices of the stream, uneven by at most one token
            total = _cum_list(cu_seqlens)[-1] if len(cu_seqlens) else 0
            a, b = _llama3_slice(total, world, rank)
            if query.shape[0] != b - a:
                raise ValueError(f"query: {query.shape[0]} local tokens: rank {rank} of {world} holds {b - a} of the "
                                 f"packed stream of {total} tokens under scheme 'llama3' (tokens [{a}, {b}))")
            return _lengths(cu_seqlens, total)
        lengths = _lengths(cu_seqlens, query.shape[0] * world)
        if scheme != "llama3":
            for i, n in enumerate(lengths):
                _shard_one(n, world, 0, scheme, None, f"length of sequence {i}")
        return lengths
    q = _bsnd(query, input_layout, head_num, "query")
    # BSH/SBH name only the query heads: K/V heads follow from the head size (GQA).
    d = q.shape[3]
    nk = key.shape[2] // d if input_layout in ("BSH", "SBH") else 0
    k = _bsnd(key, input_layout, nk, "key")
    v = _bsnd(value, input_layout, k.shape[2], "value")
    if v.shape[1] != k.shape[1] or (not cross and k.shape[1] != q.shape[1]):
        rule = (f"must equal query's {q.shape[1]} (self-attention shards)" if not cross else
                "must equal each other (cross-attention shards)")
        raise ValueError(f"key/value: local sequence lengths {k.shape[1]}/{v.shape[1]}: {rule}")
    for name, t in (("query", q), ("key", k)):
        if scheme == "zigzag" and t.shape[1] % 2:
            raise ValueError(f"{name}: local sequence length {t.shape[1]}: must be even for scheme 'zigzag' (two "
                             "chunks)")
    return q, k, v


def _checked_kv_tnd(key, value, cu_seqlens_kv, world: int, scheme: str, count: int, rank: int = 0) -> list:
    """The key sequences' lengths of TND cross-attention shards (``cu_seqlens_kv``: the global
    cumulative key lengths, one per query sequence), each sequence sharded on its own like the
    queries; scheme "llama3": the rank's slice of the packed key stream, cut like the queries'."""
    if value.shape[0] != key.shape[0]:
        raise ValueError(f"key/value: local token counts {key.shape[0]}/{value.shape[0]}: must equal each other "
                         "(cross-attention shards)")
    if scheme == "llama3":
        total = _cum_list(cu_seqlens_kv)[-1] if len(cu_seqlens_kv) else 0
        a, b = _llama3_slice(total, world, rank)
        if key.shape[0] != b - a:
            raise ValueError(f"key: {key.shape[0]} local tokens: rank {rank} of {world} holds {b - a} of the packed "
                             f"key stream of {total} tokens under scheme 'llama3' (tokens [{a}, {b}))")
        kv_lengths = _lengths(cu_seqlens_kv, total)
    else:
        kv_lengths = _lengths(cu_seqlens_kv, key.shape[0] * world)
    if len(kv_lengths) != count:
        raise ValueError(f"cu_seqlens_kv: {len(kv_lengths)} sequences: must be as many as the queries' {count}")
    for i, n in enumerate(kv_lengths if scheme != "llama3" else []):
        _shard_one(n, world, 0, scheme, None, f"key length of sequence {i}")
    return kv_lengths


def _attention_tnd(query, key, value, head_num, scale, causal, g, world, rank, comm, scheme, lengths,
                   drop=(1.0, 0, 0)):
    keep_prob, seed, offset = drop
    if world == 1:
        mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
        cum = _cum(lengths, query.device)
        out, mx, sm = _ops.flash_attention_score(query, key, value, None, None, mask, cum, cum, None, None, None, None,
                                                 scale, keep_prob, INT32_MAX, nxt, head_num, "TND", 0, mode, 1, seed,
                                                 offset)
        return out, mx[..., 0], sm[..., 0]
    dropout = (_Dropout(keep_prob, seed, offset, head_num, 0, _cum(lengths, torch.device("cpu")))
               if keep_prob < 1.0 else None)
    if comm == "ring":
        out, mx, sm = _RingAttention.apply(query[None], key[None], value[None], scale, causal, scheme, g, world, rank,
                                           lengths, dropout)
        return out[0], mx[0, ..., 0], sm[0, ..., 0]
    if comm == "allgather":
        out, mx, sm = _AllGatherVarlen.apply(query, key, value, scale, causal, scheme, g, world, rank, lengths,
                                             dropout)
        return out, mx[..., 0], sm[..., 0]
    out, mx, sm = _ulysses(query[None], key[None], value[None], scale, causal, scheme, g, world, rank, lengths,
                           dropout)
    return out[0], mx[0, ..., 0], sm[0, ..., 0]


def _attn_plain(query, key, value, head_num, layout, scale, causal, drop=(1.0, 0, 0)):
    """W = 1: the plain op in the caller's layout, bit for bit."""
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    keep_prob, seed, offset = drop
    out, mx, sm = _ops.flash_attention_score(query, key, value, None, None, mask, None, None, None, None, None, None,
                                             scale, keep_prob, INT32_MAX, nxt, head_num, layout, 0, mode, 1, seed,
                                             offset)
    return out, mx[..., 0], sm[..., 0]


def npu_fusion_attention(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                         pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                         atten_mask: Optional[Tensor] = None, scale: float = 1.0, keep_prob: float = 1.0,
                         pre_tockens: int = INT32_MAX, next_tockens: int = INT32_MAX, inner_precise: int = 0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode: int = 0,
                         gen_mask_parallel: bool = True, sync: bool = False, *, group=None, comm: str = "ring",
                         scheme: str = "zigzag", softmax_layout: str = "", pse_type: int = 1,
                         sink: Optional[Tensor] = None, pre_tokens: Optional[int] = None,
                         next_tokens: Optional[int] = None, q_start_idx=None, kv_start_idx=None, ulysses_group=None):
    """torch_npu.npu_fusion_attention over the sequence shards of a group: the 7-tuple (out,
    softmax_max, softmax_sum, softmax_out, seed, offset, numels), the statistics [B,N,S_local,8]
    for this rank's rows. Masks as in torch_npu: atten_mask None means full attention, whatever
    sparse_mode says; with a mask, sparse modes 2-4 and 6-8 are computed from the mode (the
    compressed mask is not read) on global positions, and modes 0, 1, 5 take the global mask
    (fixed layouts [S1, S2], [B, N|1, S1, S2] or [1, 1, S1, S2]; TND [maxSq, maxSkv] or [T1, T2]),
    sliced per block. prefix (modes 5/6),
    sink, and pse (alibi slopes with pse_type 2/3 on global positions, a dense global bias, or
    the compressed 1024-row alibi form) are supported. q_start_idx/kv_start_idx (torch_npu's
    keyword arguments, element 0 used; only with alibi slopes, pse_type 2/3) are the offsets of
    the global problem, as the plain op reads them: the bias of global query i and key j is
    -slope * |(j + kv_start_idx[0]) - (i + q_start_idx[0])| (sqrt of it with pse_type 3); each
    shard's own offset within the global problem is added internally.

    TND: actual_seq_qlen, actual_seq_kvlen = the global cumulative lengths (CANN style; when
    they differ, cross-attention: key/value sharded by actual_seq_kvlen, every sequence on its
    own, or slices of the packed streams with scheme="llama3"); the statistics [T_local,N,8] are in the order softmax_layout names, over the local sequences
    (the rank's share of each sequence, or its whole sequences with scheme="whole"). With a group
    of one process this is the plain op."""
    _, _, _, _, world, _ = _flat(group, ulysses_group)
    if padding_mask is not None:
        raise ValueError("padding_mask: given: reserved, must be None")
    # The alibi offsets of the global problem (checked here, so that W = 1 refuses what W > 1 refuses).
    alibi_start = _start_idx(q_start_idx, kv_start_idx, pse, pse_type)
    pre = pre_tockens if pre_tokens is None else pre_tokens
    nxt = next_tockens if next_tokens is None else next_tokens
    if input_layout != "TND" and (actual_seq_qlen is not None or actual_seq_kvlen is not None):
        raise ValueError(f"actual_seq_qlen/actual_seq_kvlen: given with input_layout {input_layout}: only TND takes them")
    if input_layout == "TND":
        as_list = [None if x is None else [int(y) for y in (x.tolist() if isinstance(x, Tensor) else x)]
                   for x in (actual_seq_qlen, actual_seq_kvlen)]
        if as_list[0] is None or as_list[1] is None:
            raise ValueError(f"actual_seq_qlen = {as_list[0]}, actual_seq_kvlen = {as_list[1]}: under context "
                             "parallelism both must be given (the global cumulative lengths)")
    # TND cross-attention: the keys' own cumulative lengths (None: self-attention lengths).
    kv_cum = None
    if input_layout == "TND" and as_list[0] != as_list[1]:
        kv_cum = as_list[1]
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"keep_prob = {keep_prob}: must be in (0, 1]")
    # torch_npu's rule: no mask tensor, no masking (the mode and the tokens are ignored).
    mode = 1 if atten_mask is None else sparse_mode
    g = _group_info(group)[0]
    seed = _shared_seed(g) if keep_prob < 1.0 else 0
    if world == 1 and scheme != "whole":
        _checked(query, key, value, head_num, input_layout, comm, scheme, world, actual_seq_qlen,
                 _is_cross(query, key, input_layout) or kv_cum is not None)
        if keep_prob < 1.0:  # the plain op with the group's seed
            cum = [int(x) for x in actual_seq_qlen] if input_layout == "TND" else None
            out, mx, sm = _plain_general(query, key, value, head_num, input_layout, scale, mode, pre, nxt,
                                         atten_mask if mode in (0, 1, 5) else None, prefix if mode in (5, 6) else None,
                                         sink, pse, pse_type, cum, (keep_prob, seed, 0), kv_cum, alibi_start)
            mx, sm = (x[..., None].expand(*x.shape, _ops.STAT_LANES).contiguous() for x in (mx, sm))
            if input_layout == "TND" and softmax_layout != "TND":
                mx, sm = (tnd_stats_from_token_major(x, actual_seq_qlen) for x in (mx, sm))
            return out, mx, sm, query.new_empty((0,)), seed, 0, _numels(query, head_num, input_layout, actual_seq_qlen,
                                                                        kv_cum=kv_cum)
        return _plain_npu_fusion_attention(query, key, value, head_num, input_layout, pse=pse, atten_mask=atten_mask,
                                           scale=scale, pre_tockens=pre, next_tockens=nxt,
                                           inner_precise=inner_precise, prefix=prefix, sparse_mode=sparse_mode,
                                           actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                                           softmax_layout=softmax_layout, pse_type=pse_type, sink=sink,
                                           q_start_idx=None if q_start_idx is None else [alibi_start[0]],
                                           kv_start_idx=None if kv_start_idx is None else [alibi_start[1]])
    out, mx, sm = attention(query, key, value, head_num, input_layout, scale=scale, group=group, comm=comm,
                            scheme=scheme, cu_seqlens=actual_seq_qlen, sparse_mode=mode,
                            pre_tokens=pre if mode in (0, 4, 7, 8) else INT32_MAX,
                            next_tokens=nxt if mode in (0, 4, 7, 8) else INT32_MAX,
                            atten_mask=atten_mask if mode in (0, 1, 5) else None,
                            prefix=prefix if mode in (5, 6) else None, sink=sink, pse=pse, pse_type=pse_type,
                            ulysses_group=ulysses_group, keep_prob=keep_prob, seed=seed, cu_seqlens_kv=kv_cum,
                            q_start_idx=q_start_idx, kv_start_idx=kv_start_idx)
    lanes = _ops.STAT_LANES
    mx, sm = (x[..., None].expand(*x.shape, lanes).contiguous() for x in (mx, sm))
    if input_layout == "TND" and softmax_layout != "TND":
        if scheme == "whole":
            _, w, r = _group_info(group)
            local_cum = whole_cu_seqlens(actual_seq_qlen, w, r) or [0]
        elif scheme == "llama3":
            local_cum = llama3_cu_seqlens(actual_seq_qlen, world, _flat(group, ulysses_group)[5]) or [0]
        else:
            local_cum = _cum([n // world for n in _lengths(actual_seq_qlen, query.shape[0] * world)], query.device)
        mx, sm = (tnd_stats_from_token_major(x, local_cum) for x in (mx, sm))
    if keep_prob < 1.0:
        return out, mx, sm, query.new_empty((0,)), seed, 0, _numels(query, head_num, input_layout, actual_seq_qlen,
                                                                    world, kv_cum)
    return out, mx, sm, query.new_empty((0,)), 0, 0, 0


def _window_args(causal: bool, window_size, alibi_slopes, shift: int = 0):
    """cp.attention keywords for flash-attn's causal flag, window and alibi slopes on global
    positions; shift = Sk - Sq of the global problem: flash-attn's alibi distance |i + Sk - Sq -
    j| (bottom-right aligned, as attnops.torch.flash_attn passes it)."""
    from .flash_attn import _mask_args

    mode, pre, nxt, _ = _mask_args(causal, window_size)
    kw = dict(sparse_mode=None, causal=causal)
    if mode == 4:
        kw = dict(sparse_mode=4, pre_tokens=pre, next_tokens=nxt)
    if alibi_slopes is not None:
        kw.update(pse=alibi_slopes, pse_type=2, q_start_idx=max(shift, 0), kv_start_idx=max(-shift, 0))
    return kw


def _varlen_alibi_shift(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, alibi_slopes) -> int:
    """Sk - Sq of every packed sequence (flash-attn's alibi distance); as in
    attnops.torch.flash_attn, one value must serve them all."""
    if alibi_slopes is None:
        return 0
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    shifts = {(ck[i + 1] - ck[i]) - (cq[i + 1] - cq[i]) for i in range(len(cq) - 1)}
    if len(shifts) > 1:
        raise ValueError(f"alibi_slopes with cu_seqlens_k - cu_seqlens_q differences {sorted(shifts)}: attnops needs "
                         "the same key-minus-query length in every sequence")
    return shifts.pop() if shifts else 0


def _shared_seed(g) -> int:
    """A dropout seed drawn from rank 0's default generator and broadcast to the group (every rank
    draws one, so the generators stay in step), so that the ranks cannot disagree on it."""
    seed = torch.tensor([draw_seed()], dtype=torch.int64)
    if dist.get_world_size(g) > 1:
        comm_stats.record("seed", seed)
        dist.broadcast(seed, dist.get_global_rank(g, 0), group=g)
    return int(seed[0])


def _numels(query: Tensor, head_num: int, layout: str, actual_seq_qlen, world: int = 1, kv_cum=None) -> int:
    """Dropout bits of the global problem (torch_npu's numels output)."""
    if layout == "TND":
        cum = _cum_list(actual_seq_qlen)
        kcum = cum if kv_cum is None else _cum_list(kv_cum)
        lens = [b - a for a, b in zip([0] + cum[:-1], cum)]
        kv_lens = [b - a for a, b in zip([0] + kcum[:-1], kcum)]
        return head_num * sum(n * m for n, m in zip(lens, kv_lens))
    q = _bsnd(query, layout, head_num, "query")
    s = q.shape[1] * world
    return q.shape[0] * q.shape[2] * s * s


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, group=None, comm: str = "ring", scheme: str = "zigzag",
                    ulysses_group=None):
    """flash_attn_func over the sequence shards of a group: q/k/v [B, S_local, H, D] -> out
    [B, S_local, H, D] (and softmax_lse [B, H, S_local] with return_attn_probs). window_size and
    alibi_slopes apply to global positions; dropout (no window or alibi) draws the single-process
    op's keep bits. With a group of one process this is attnops.torch.flash_attn_func."""
    g, _, _, _, world, _ = _flat(group, ulysses_group)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p = {dropout_p}: must be in [0, 1)")
    if softcap != 0.0:
        raise ValueError(f"softcap = {softcap}: not supported under context parallelism, must be 0.0")
    if world == 1 and dropout_p == 0.0:
        _checked(q, k, v, q.shape[2], "BSND", comm, scheme, world, None, _is_cross(q, k, "BSND"))
        return _plain_flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, 0.0, alibi_slopes,
                                      return_attn_probs=return_attn_probs)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    seed = _shared_seed(g) if dropout_p > 0.0 else 0
    out, mx, sm = attention(q, k, v, q.shape[2], "BSND", scale=scale, group=group, comm=comm, scheme=scheme,
                            ulysses_group=ulysses_group, keep_prob=1.0 - dropout_p, seed=seed,
                            **_window_args(causal, window_size, alibi_slopes, (k.shape[1] - q.shape[1]) * world))
    if return_attn_probs:
        return out, (mx + torch.log(sm)).detach(), None
    return out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None, *, group=None,
                           comm: str = "allgather", scheme: str = "zigzag", ulysses_group=None):
    """flash_attn_varlen_func over the shards of packed sequences: q/k/v [T_local, H, D], each
    sequence sharded on its own (``shard(..., cu_seqlens=)``); cu_seqlens_q, cu_seqlens_k: the
    global cumulative lengths (int32, leading 0); when they differ (cross-attention) k/v are
    sharded by cu_seqlens_k, every sequence on its own. Returns out
    [T_local, H, D] (and softmax_lse [H, T_local] with return_attn_probs). window_size and
    alibi_slopes ([H]) apply per sequence, on global positions; dropout (no window or alibi) draws
    the single-process op's keep bits. scheme="whole": whole sequences per rank (:func:`shard_whole`;
    with cross-attention k/v follow their queries: ``shard_whole(k, cu_seqlens=cu_seqlens_k,
    assign_by=cu_seqlens_q)``)."""
    g, _, _, _, world, _ = _flat(group, ulysses_group)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p = {dropout_p}: must be in [0, 1)")
    if softcap != 0.0 or block_table is not None:
        raise ValueError(f"softcap = {softcap}, block_table: not supported under context parallelism (must be 0.0, "
                         "None)")
    # Cross-attention (TND): the keys' own global cumulative lengths, each sequence sharded on its own.
    cross = not torch.equal(cu_seqlens_q.cpu(), cu_seqlens_k.cpu())
    if world == 1 and scheme != "whole" and dropout_p == 0.0:
        _checked(q, k, v, q.shape[1], "TND", comm, scheme, world, cu_seqlens_q, cross)
        if cross:
            _checked_kv_tnd(k, v, cu_seqlens_k, world, scheme, len(_lengths(cu_seqlens_q, q.shape[0])))
        return _plain_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                             softmax_scale, causal, window_size, 0.0, alibi_slopes,
                                             return_attn_probs=return_attn_probs)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    seed = _shared_seed(g) if dropout_p > 0.0 else 0
    out, mx, sm = attention(q, k, v, q.shape[1], "TND", scale=scale, group=group, comm=comm, scheme=scheme,
                            cu_seqlens=cu_seqlens_q, ulysses_group=ulysses_group, keep_prob=1.0 - dropout_p, seed=seed,
                            cu_seqlens_kv=cu_seqlens_k if cross else None,
                            **_window_args(causal, window_size, alibi_slopes,
                                           _varlen_alibi_shift(cu_seqlens_q, cu_seqlens_k, alibi_slopes)))
    if return_attn_probs:
        return out, (mx + torch.log(sm)).detach().transpose(0, 1), None
    return out


# ---------------------------------------------------------------------------------------------
# Masks, sinks, pse and the Ulysses + ring hybrid (block-wise path: attnops.torch._cp_general)

# Compressed masks for the plain op (W = 1): their content is not read, the rule comes from the mode.
_PREFIX_MASK = torch.zeros(3072, 2048, dtype=torch.bool)


def _needs_general(sparse_mode, pre_tokens, next_tokens, atten_mask, prefix, sink, pse, pse_type,
                   ulysses_group) -> bool:
    if any(x is not None for x in (atten_mask, prefix, sink, pse)) or pse_type != 1:
        return True
    if ulysses_group is not None:
        return True
    if sparse_mode is None or sparse_mode in (2, 3):
        return False
    return not (sparse_mode in (0, 1) and pre_tokens == INT32_MAX and next_tokens == INT32_MAX)


def _flat(group, ulysses_group):
    """(ring group, its size, rank; inner (group, size, rank) or None; flat size, flat rank)."""
    g, world, rank = _group_info(group)
    if ulysses_group is None:
        return g, world, rank, None, world, rank
    ig, iw, ir = _group_info(ulysses_group)
    return g, world, rank, (ig, iw, ir), world * iw, rank * iw + ir


def _plain_rule_args(sparse_mode: int, atten_mask):
    """(sparse_mode, atten_mask) for the plain op that apply ``sparse_mode`` as a rule (as
    cp.attention does): modes that read no mask get the compressed one; mode 0 / 5 without a
    mask become their mask-free equivalents 4 / 6 (Sq = Skv)."""
    if atten_mask is None:
        sparse_mode = {0: 4, 5: 6}.get(sparse_mode, sparse_mode)
        if sparse_mode in (2, 3, 4, 7, 8):
            atten_mask = _CAUSAL_MASK
        elif sparse_mode == 6:
            atten_mask = _PREFIX_MASK
    elif sparse_mode in (2, 3, 4, 7, 8):
        atten_mask = _CAUSAL_MASK
    elif sparse_mode == 6:
        atten_mask = _PREFIX_MASK
    return sparse_mode, atten_mask


def _plain_general(query, key, value, head_num, layout, scale, sparse_mode, pre_tokens, next_tokens, atten_mask,
                   prefix, sink, pse, pse_type, cum, drop=(1.0, 0, 0), kv_cum=None, alibi_start=(0, 0)):
    """One process: the plain op with every argument (bit for bit); statistics [B,N,S] / [T,N].
    drop: (keep_prob, seed, offset). kv_cum: the keys' cumulative lengths (TND cross-attention),
    else cum. alibi_start: the alibi (qStartIdx, kvStartIdx)."""
    qs, ks = ([alibi_start[0]], [alibi_start[1]]) if tuple(alibi_start) != (0, 0) else (None, None)
    mode, mask = _plain_rule_args(sparse_mode, atten_mask)
    kv_cum = cum if kv_cum is None else kv_cum
    if drop[0] < 1.0:  # the op itself with the caller's seed (npu_fusion_attention draws its own)
        c = torch.tensor([int(x) for x in cum], dtype=torch.int64) if layout == "TND" else None
        ck = torch.tensor([int(x) for x in kv_cum], dtype=torch.int64) if layout == "TND" else None
        pl = None if prefix is None else [int(x) for x in (prefix.tolist() if isinstance(prefix, Tensor) else prefix)]
        out, mx, sm = _ops.flash_attention_score(query, key, value, pse, None, mask, c, ck, sink, pl, qs, ks,
                                                 float(scale), float(drop[0]), pre_tokens, next_tokens, head_num,
                                                 layout, 0, mode, pse_type, drop[1], drop[2])
        return out, mx[..., 0], sm[..., 0]
    extra = dict(actual_seq_qlen=cum, actual_seq_kvlen=kv_cum, softmax_layout="TND") if layout == "TND" else {}
    out, mx, sm = _plain_npu_fusion_attention(query, key, value, head_num, layout, pse=pse, atten_mask=mask,
                                              scale=scale, pre_tockens=pre_tokens, next_tockens=next_tokens,
                                              prefix=prefix, sparse_mode=mode, pse_type=pse_type, sink=sink,
                                              q_start_idx=qs, kv_start_idx=ks, **extra)[:3]
    return out, mx[..., 0], sm[..., 0]


def _plain_band(sparse_mode, atten_mask, cross, pre_tokens, next_tokens, seq_len, kv_len, lengths, kv_lengths):
    """(pre_tokens, next_tokens) for the plain op that give the rule's band, or None when it has none.
    The plain op has no mask-free top-left band: _plain_rule_args turns mode 0 without a mask into
    mode 4 (bottom-right), the same band only when Sq = Skv. With one offset d = Skv - Sq for every
    sequence, the top-left band -pre <= j - i <= next is mode 4's band with pre + d and next - d;
    with per-sequence offsets (TND cross-attention) there is none, and the block-wise path, with a
    world of one, applies the rule."""
    if not (sparse_mode == 0 and atten_mask is None and cross):
        return pre_tokens, next_tokens
    offsets = {b - a for a, b in zip(lengths, kv_lengths)} if kv_lengths is not None else {kv_len - seq_len}
    if len(offsets) != 1:
        return None
    d = offsets.pop()
    return gen._clamp_tokens(pre_tokens + d), gen._clamp_tokens(next_tokens - d)


def _check_sink(sink, heads: int) -> None:
    if sink is not None and (sink.dtype != torch.float32 or tuple(sink.shape) != (heads,)):
        raise ValueError(f"sink: shape {list(sink.shape)} dtype {sink.dtype}: must be fp32 [N] = [{heads}]")


def _general_attention(query, key, value, head_num, layout, scale, causal, group, comm, scheme, cu_seqlens,
                       sparse_mode, pre_tokens, next_tokens, atten_mask, prefix, sink, pse, pse_type, ulysses_group,
                       drop=(1.0, 0, 0), cu_seqlens_kv=None, alibi_start=(0, 0)):
    g, world, rank, inner, fw, fr = _flat(group, ulysses_group)
    if inner is not None and comm not in ("ring", "allgather"):
        raise ValueError(f"comm = {comm!r} with ulysses_group: the hybrid runs Ulysses inside ulysses_group and "
                         "'ring' or 'allgather' across group")
    cross = _is_cross(query, key, layout) or cu_seqlens_kv is not None
    checked = _checked(query, key, value, head_num, layout, comm, scheme, fw, cu_seqlens, cross, fr)
    if sparse_mode is None:
        sparse_mode = 3 if causal else 1
    kv_lengths = kv_cum = kv_starts = None
    if layout == "TND":
        lengths = checked
        q, k, v = query[None], key[None], value[None]
        cum = _cum(lengths, query.device)
        starts = [0] + cum.tolist()[:-1]
        batch, heads, seq_len = 1, query.shape[1], int(sum(lengths))
        kv_len = seq_len
        if cu_seqlens_kv is not None:
            kv_lengths = _checked_kv_tnd(key, value, cu_seqlens_kv, fw, scheme, len(lengths), fr)
            kv_cum = _cum(kv_lengths, query.device)
            kv_starts = [0] + kv_cum.tolist()[:-1]
            kv_len = int(sum(kv_lengths))
    else:
        lengths, cum, starts = None, None, None
        q, k, v = checked
        batch, heads, seq_len = q.shape[0], q.shape[2], q.shape[1] * fw
        kv_len = k.shape[1] * fw if cross else seq_len
    _check_sink(sink, heads)
    geom = gen.geometry(sparse_mode, pre_tokens, next_tokens, atten_mask, prefix, pse, pse_type, batch=batch,
                        heads=heads, seq_len=seq_len, lengths=lengths, kv_len=None if layout == "TND" else kv_len,
                        kv_lengths=kv_lengths, q_start_idx=alibi_start[0], kv_start_idx=alibi_start[1])
    band = _plain_band(sparse_mode, atten_mask, cross, pre_tokens, next_tokens, seq_len, kv_len, lengths, kv_lengths)
    if fw == 1 and band is not None:
        return _plain_general(query, key, value, head_num, layout, scale, sparse_mode, band[0], band[1],
                              atten_mask, prefix, sink, pse, pse_type, cum, drop, kv_cum, alibi_start)
    if drop[0] < 1.0:
        geom.drop = gen.DropSpec(drop[0], drop[1], drop[2], heads, 0, seq_len, kv_len,
                                 cum.cpu() if cum is not None else None, kv_cum.cpu() if kv_cum is not None else None)

    # "llama3" with W not dividing T: the slices differ by a token. Every rank pads its q/k/v to
    # the longest slice (equal transfers for the ring, the all-gather and Ulysses); padded rows
    # have position -1, which gen.runs leaves out, so they are in no block: no kernel call reads
    # or writes them, and they are cut off the output (their gradients are then zero).
    # Cross-attention pads the key/value slices on their own (their stream has its own length).
    llama3 = layout == "TND" and scheme == "llama3"
    pad_to = -(-seq_len // fw) if llama3 and seq_len % fw else 0
    kv_pad_to = (-(-kv_len // fw) if llama3 and kv_len % fw else 0) if cross else pad_to

    def padded(t, rows):
        return torch.cat([t, t.new_zeros((1, rows - t.shape[1]) + tuple(t.shape[2:]))], 1) if rows else t

    local_rows = q.shape[1]
    q, k, v = padded(q, pad_to), padded(k, kv_pad_to), padded(v, kv_pad_to)

    def with_padding(pos, rows):
        return torch.cat([pos, pos.new_full((rows - pos.numel(),), -1)]) if rows else pos

    def positions_of(flat_rank):
        return with_padding(shard_index(seq_len, fw, flat_rank, scheme, query.device, cu_seqlens=cum), pad_to)

    def kv_positions_of(flat_rank):
        return with_padding(shard_index(kv_len, fw, flat_rank, scheme, query.device, cu_seqlens=kv_cum), kv_pad_to)

    if comm == "ulysses":
        inner, g, world, rank, comm = (g, world, rank), None, 1, 0, "allgather"
    out, mx, sm = gen.attention(q, k, v, sink, geom, scale, comm, g, world, rank, positions_of, starts, inner,
                                kv_positions_of if cross else None, kv_starts)
    if pad_to:
        out, mx, sm = out[:, :local_rows], mx[:, :local_rows], sm[:, :local_rows]
    if layout == "TND":
        return out[0], mx[0, ..., 0], sm[0, ..., 0]
    return _from_bsnd(out, layout), mx[..., 0].transpose(1, 2), sm[..., 0].transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# Whole-sequence spreading of packed sequences (TND, scheme="whole")


def llama3_cu_seqlens(cu_seqlens, world_size: int, rank: int) -> list:
    """Cumulative lengths (no leading 0) of the pieces of packed sequences that ``rank``'s slice of
    the stream holds under scheme "llama3" (the stream cut into W slices [floor(r*T/W),
    floor((r+1)*T/W)); a sequence cut by a slice boundary contributes a piece to each side; empty
    pieces left out)."""
    cum = _cum_list(cu_seqlens)
    total = cum[-1] if cum else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"world_size = {world_size}, rank = {rank}: need 0 <= rank < world_size")
    a, b = _llama3_slice(total, world_size, rank)
    ends = sorted({min(max(x, a), b) for x in cum} | {b})
    return [e - a for e in ends if e > a]


def _cum_list(cu_seqlens) -> list:
    cum = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    if any(b < a for a, b in zip(cum, cum[1:])) or (cum and cum[0] < 0):
        raise ValueError(f"cu_seqlens = {cum}: must be non-decreasing cumulative lengths")
    return cum


def assign_sequences(cu_seqlens, world_size: int) -> list:
    """The rank of each packed sequence when whole sequences are spread over ``world_size``
    ranks, balanced by work: sequences by decreasing work (n^2, proportional to the work of a full
    or a causal mask alike, so the assignment does not depend on the mask; ties by index) each go
    to the least loaded rank (ties: the lowest rank). Deterministic, so every
    rank computes the same assignment without communicating. ``cu_seqlens``: cumulative lengths,
    with or without a leading 0 (a leading 0 is an empty sequence)."""
    if world_size < 1:
        raise ValueError(f"world_size = {world_size}: must be >= 1")
    cum = _cum_list(cu_seqlens)
    lengths = [b - a for a, b in zip([0] + cum[:-1], cum)]
    work = [n * n for n in lengths]
    load, owner = [0] * world_size, [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-work[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += work[i]
    return owner


def _owner(cum: list, world_size: int, assign_by=None) -> list:
    """The rank of each sequence of ``cum`` under whole-sequence spreading: assign_sequences of
    ``assign_by`` (the queries' cumulative lengths: keys/values of cross-attention follow their
    queries, whatever their own lengths) or of ``cum`` itself."""
    if assign_by is None:
        return assign_sequences(cum, world_size)
    by = _cum_list(assign_by)
    if len(by) != len(cum):
        raise ValueError(f"assign_by: {len(by)} sequences: must be as many as cu_seqlens' {len(cum)} (the queries' "
                         "cumulative lengths of the same packed sequences)")
    return assign_sequences(by, world_size)


def whole_cu_seqlens(cu_seqlens, world_size: int, rank: int, assign_by=None) -> list:
    """Cumulative lengths (no leading 0) of the sequences ``rank`` holds, in global order.
    ``assign_by``: place the sequences by these (the queries') cumulative lengths instead."""
    cum = _cum_list(cu_seqlens)
    lengths = [b - a for a, b in zip([0] + cum[:-1], cum)]
    owner = _owner(cum, world_size, assign_by)
    mine = [n for n, r in zip(lengths, owner) if r == rank]
    return torch.tensor(mine, dtype=torch.int64).cumsum(0).tolist()


def whole_index(cu_seqlens, world_size: int, rank: int, device=None, assign_by=None) -> Tensor:
    """Global token positions held by ``rank`` under whole-sequence spreading, in local order.
    ``assign_by``: place the sequences by these (the queries') cumulative lengths instead."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank = {rank}, world_size = {world_size}: need 0 <= rank < world_size")
    cum = _cum_list(cu_seqlens)
    owner = _owner(cum, world_size, assign_by)
    parts = [torch.arange(a, b, device=device) for a, b, r in zip([0] + cum[:-1], cum, owner) if r == rank]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def shard_whole(x: Tensor, group=None, *, cu_seqlens, seq_dim: int = 0, assign_by=None) -> Tensor:
    """This rank's whole sequences of a packed global tensor (no communication). Cross-attention
    keys/values: ``cu_seqlens`` their own cumulative lengths, ``assign_by`` the queries', so that
    every sequence's keys land on the rank of its queries."""
    _, world, rank = _group_info(group)
    cum = _cum_list(cu_seqlens)
    if (cum[-1] if cum else 0) != x.shape[seq_dim]:
        raise ValueError(f"cu_seqlens: total {cum[-1] if cum else 0}: must equal x.shape[{seq_dim}] = "
                         f"{x.shape[seq_dim]}")
    return x.index_select(seq_dim, whole_index(cum, world, rank, x.device, assign_by))


def unshard_whole(x: Tensor, group=None, *, cu_seqlens, seq_dim: int = 0, assign_by=None) -> Tensor:
    """The packed global tensor from every rank's whole sequences (an all-gather of the shards
    padded to the longest; every rank gets it). ``assign_by``: as in :func:`shard_whole`."""
    g, world, rank = _group_info(group)
    cum = _cum_list(cu_seqlens)
    idx = [whole_index(cum, world, j, x.device, assign_by) for j in range(world)]
    if x.shape[seq_dim] != idx[rank].numel():
        raise ValueError(f"x: {x.shape[seq_dim]} rows along seq_dim {seq_dim}: rank {rank} holds "
                         f"{idx[rank].numel()} tokens under whole-sequence spreading")
    longest = max(i.numel() for i in idx)
    local = x.movedim(seq_dim, 0)
    pad = local.new_zeros((longest,) + tuple(local.shape[1:]))
    pad[:local.shape[0]] = local
    parts = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(parts, pad.contiguous(), group=g)
    full = torch.cat([p[:i.numel()] for p, i in zip(parts, idx)])
    return full.index_select(0, torch.argsort(torch.cat(idx))).movedim(0, seq_dim)


class _WholeDropAttention(torch.autograd.Function):
    """A rank's whole sequences with dropout keyed by their global sequence (TND): the op through
    the extended entry points, local sequence i drawing the bits of global sequence seq_index[i]."""

    @staticmethod
    def forward(ctx, q, k, v, sink, args, kw):
        mask, cum, kv_cum, scale, keep, pre, nxt, heads, mode, seed, offset = args
        out, mx, sm = _ops.flash_attention_score_ex(q, k, v, mask, cum, kv_cum, scale, keep, pre, nxt, heads, "TND",
                                                    mode, seed, offset, sink=sink, **kw)
        ctx.save_for_backward(q, k, v, out, mx, sm, sink)
        ctx.cfg = (args, kw)
        ctx.mark_non_differentiable(mx, sm)
        return out, mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm, sink = ctx.saved_tensors
        (mask, cum, kv_cum, scale, keep, pre, nxt, heads, mode, seed, offset), kw = ctx.cfg
        dq, dk, dv, dsink = _ops.flash_attention_score_grad_ex(q, k, v, dout.to(q.dtype).contiguous(), mask, mx, sm, out,
                                                               cum, kv_cum, scale, keep, pre, nxt, heads, "TND", mode,
                                                               seed, offset, sink=sink, **kw)
        return dq, dk, dv, (dsink if sink is not None else None), None, None


def _whole_attention(query, key, value, head_num, layout, scale, causal, group, cu_seqlens, sparse_mode,
                     pre_tokens, next_tokens, prefix, sink, pse, pse_type, drop=(1.0, 0, 0), atten_mask=None,
                     alibi_start=(0, 0), cu_seqlens_kv=None):
    """Whole sequences per rank: each rank attends within its own sequences, no communication. A
    global explicit mask and a global dense pse (TND forms) are cut down to the rank's sequences.
    Cross-attention (``cu_seqlens_kv``: the keys' global cumulative lengths): the sequences are
    assigned by the query lengths (assign_sequences), and each rank holds the keys of its own
    queries' sequences (shard_whole(key, cu_seqlens=cu_seqlens_kv, assign_by=cu_seqlens)), so
    every sequence is still attended on one rank, the plain op's rules applied per sequence."""
    g, world, rank = _group_info(group)
    if layout != "TND":
        raise ValueError(f"scheme = 'whole': spreads whole packed sequences; input_layout must be TND, not {layout!r}")
    if cu_seqlens is None:
        raise ValueError("cu_seqlens: None: required for input_layout TND (the global cumulative sequence lengths)")
    if sparse_mode is None:
        sparse_mode = 3 if causal else 1
    if sparse_mode in (7, 8):
        raise ValueError(f"sparse_mode = {sparse_mode}: modes 7/8 single out the globally last/first sequence; not "
                         "available with scheme 'whole'")
    cum = _cum_list(cu_seqlens)
    kv_cum = cum if cu_seqlens_kv is None else _cum_list(cu_seqlens_kv)
    if len(kv_cum) != len(cum):
        raise ValueError(f"cu_seqlens_kv: {len(kv_cum)} sequences: must be as many as the queries' {len(cum)}")
    owner = assign_sequences(cum, world)  # by the query lengths; keys follow their queries
    local_cum = whole_cu_seqlens(cum, world, rank)
    local_kv_cum = whole_cu_seqlens(kv_cum, world, rank, assign_by=cum)
    t_local = local_cum[-1] if local_cum else 0
    tk_local = local_kv_cum[-1] if local_kv_cum else 0
    for name, t, n in (("query", query, t_local), ("key", key, tk_local), ("value", value, tk_local)):
        if t.dim() != 3 or t.shape[0] != n:
            how = ("see shard_whole" if name == "query" or cu_seqlens_kv is None else
                   "keys follow their queries' rank: shard_whole(..., cu_seqlens=cu_seqlens_kv, assign_by=cu_seqlens)")
            raise ValueError(f"{name}: shape {list(t.shape)}: rank {rank} holds {n} tokens under whole-sequence "
                             f"spreading ([T_local, N, D]; {how})")
    lengths = [b - a for a, b in zip([0] + cum[:-1], cum)]
    kv_lengths = [b - a for a, b in zip([0] + kv_cum[:-1], kv_cum)]
    if prefix is not None:
        values = [int(x) for x in (prefix.tolist() if isinstance(prefix, Tensor) else prefix)]
        if len(values) != len(owner):
            raise ValueError(f"prefix: {len(values)} values: must be one per sequence ({len(owner)})")
        prefix = [p for p, r in zip(values, owner) if r == rank]
    _check_sink(sink, query.shape[1])
    if sink is not None and world > 1:
        sink = ReplicatedGrad.apply(sink, g, world)  # dsink of every rank's sequences, on every rank
    mine = [i for i, r in enumerate(owner) if r == rank]
    if atten_mask is not None and sparse_mode in (0, 1, 5):
        atten_mask = _whole_mask(atten_mask, lengths, kv_lengths, mine, sparse_mode)
    elif sparse_mode not in (0, 1, 5):
        atten_mask = None  # the rule comes from the mode (the compressed mask is not read)
    if pse is not None and pse_type in (0, 1):
        pse = _whole_pse(pse, query.shape[1], lengths, kv_lengths, mine, pse_type, sparse_mode, atten_mask,
                         next_tokens)
    if not local_cum:
        local_cum = local_kv_cum = [0]  # no sequence here: one empty one, so the op still runs (and autograd
        mine = [0]  # connects; drawing no bits)
        if prefix is not None:
            prefix = [0]
    if drop[0] < 1.0 and world > 1:
        mode, mask = _plain_rule_args(sparse_mode, atten_mask)
        c = torch.tensor(local_cum, dtype=torch.int64)
        ck = torch.tensor(local_kv_cum, dtype=torch.int64)
        geo = _ops.DropoutGeometry(head_num=query.shape[1], actual_seq_qlen=torch.tensor(cum, dtype=torch.int64),
                                   actual_seq_kvlen=torch.tensor(kv_cum, dtype=torch.int64),
                                   seq_index=torch.tensor(mine, dtype=torch.int64))
        kw = dict(drop=geo, pse=pse, pse_type=pse_type, prefix=prefix)
        if tuple(alibi_start) != (0, 0):
            kw.update(q_start_idx=[alibi_start[0]], kv_start_idx=[alibi_start[1]])
        out, mx, sm = _WholeDropAttention.apply(query, key, value, sink,
                                                (mask, c, ck, scale, drop[0], pre_tokens, next_tokens, head_num, mode,
                                                 drop[1], drop[2]), kw)
        return out, mx[..., 0], sm[..., 0]
    return _plain_general(query, key, value, head_num, "TND", scale, sparse_mode, pre_tokens, next_tokens,
                          atten_mask, prefix, sink, pse, pse_type, local_cum, drop,
                          None if cu_seqlens_kv is None else local_kv_cum, alibi_start=alibi_start)


def _whole_mask(mask: Tensor, lengths, kv_lengths, mine, sparse_mode: int) -> Tensor:
    """The rank's [T_local, Tk_local] explicit mask (packed rows and columns of its sequences) from
    the global one, [maxSq, maxSkv] or [T1, T2] (the plain op reads both forms; only pairs inside a
    sequence matter)."""
    mask, origin = gen._tnd_mask_geometry(mask, lengths, kv_lengths, sparse_mode)
    rows = [torch.arange(origin[i][0], origin[i][0] + lengths[i]) for i in mine]
    cols = [torch.arange(origin[i][1], origin[i][1] + kv_lengths[i]) for i in mine]
    r = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    c = torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)
    return mask.index_select(0, r.to(mask.device)).index_select(1, c.to(mask.device)).contiguous()


def _whole_pse(pse: Tensor, heads: int, lengths, kv_lengths, mine, pse_type: int, sparse_mode: int, atten_mask,
               next_tokens: int) -> Tensor:
    """The rank's TND pse from the global one: its sequences' [N, Sq_i|1, Skv_i] blocks of the
    flattened forms, in local order; or the compressed alibi form [B|1, N, 1024, W] (checked
    against the global problem, so that every rank accepts or refuses alike) with its batch rows
    cut down to the rank's sequences (one row when the rank holds none: the op then runs on one
    empty sequence)."""
    if gen.compressed_alibi(pse, sparse_mode, atten_mask, next_tokens, batch=len(lengths), heads=heads,
                            seq_len=sum(lengths), kv_len=sum(kv_lengths), lengths=lengths, kv_lengths=kv_lengths):
        if pse.shape[0] == 1:
            return pse
        return pse.index_select(0, torch.tensor(mine or [0], dtype=torch.int64, device=pse.device))
    blocks = gen._tnd_pse_blocks(pse, heads, lengths, kv_lengths, pse_type)
    parts = [blocks[i].reshape(-1) for i in mine]
    return torch.cat(parts) if parts else pse.new_zeros((0,))
