"""Context parallelism on torch.distributed: one attention spread over the processes of a group,
each holding a shard of the sequence (gloo on CPU; the code assumes no device except in the
attnops kernel call, so NCCL can follow with a GPU backend).

Three ways to move data (``comm=``):
- ``"ring"``: K/V blocks travel around the ring with ``batch_isend_irecv``, double-buffered: the
  transfer of step s+1 is posted before the block of step s is computed. Partial results merge
  in fp32 by their softmax statistics (attnops.torch.merge). The backward sends K/V around again
  and the fp32 dK/dV accumulators one hop behind them; they come home after W hops.
- ``"allgather"`` (Llama 3 style): all-gather K/V, one kernel call per local query chunk over the
  key prefix it needs (bottom-right causal), no merge; dK/dV go back by a reduce-scatter (an
  all-to-all and a sum in rank order, so the result does not depend on the backend's reduction
  order).
- ``"ulysses"``: all-to-all from sequence shards to head shards, the plain op over the whole
  sequence for N/W heads, all-to-all back (K/V heads are repeated when Nk is not divisible by W).

Sharding (``scheme=``): ``"zigzag"`` cuts the sequence into 2W chunks and gives rank r chunks r
and 2W-1-r (every rank then does the same causal work); ``"contiguous"`` gives rank r the r-th of
W equal pieces. :func:`shard` / :func:`unshard` move tensors between the two views.

Numerics: ring and all-gather call the kernels in fp32 whatever the input dtype (partial outputs,
statistics and gradients are fp32 and are cast once at the end), so a bf16/fp16 run is at least
as accurate as the single-process op. With W = 1 every entry point is the plain op itself (bit
for bit). Results are bitwise reproducible run to run at a given W: every sum has a fixed order.

Supported now: layouts BSND, BNSD, BSH, SBH; self-attention (equal local query and key lengths);
no mask or causal; GQA/MQA; Dv != D. Not yet: TND, band/prefix masks, pse, sink, dropout.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _ops
from .merge import merge_max_sum
from .flash_attn import _CAUSAL_MASK, flash_attn_func as _plain_flash_attn_func
from .npu import npu_fusion_attention as _plain_npu_fusion_attention

INT32_MAX = _ops.INT32_MAX
SCHEMES = ("zigzag", "contiguous")
COMMS = ("ring", "allgather", "ulysses")
# The sequence axis of each supported layout.
SEQ_DIM = {"BSND": 1, "BNSD": 2, "BSH": 1, "SBH": 0}


class CommStats:
    """What this process sent since the last reset: transfers by kind (one per send or
    collective call), bytes sent by kind, and seconds spent waiting for communication to finish
    (the part not hidden behind compute)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.transfers: Counter = Counter()
        self.bytes: Counter = Counter()
        self.wait_s = 0.0

    def record(self, kind: str, sent: Tensor) -> None:
        self.transfers[kind] += 1
        self.bytes[kind] += sent.numel() * sent.element_size()


comm_stats = CommStats()


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


def shard_index(seq_len: int, world_size: int, rank: int, scheme: str = "zigzag", device=None) -> Tensor:
    """Global sequence positions held by ``rank`` (int64, in local order)."""
    _check_scheme(scheme)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank = {rank}, world_size = {world_size}: need 0 <= rank < world_size")
    parts = 2 * world_size if scheme == "zigzag" else world_size
    if seq_len % parts:
        raise ValueError(f"sequence length {seq_len}: must be divisible by {parts} for scheme {scheme!r} with "
                         f"{world_size} ranks (pad the sequence)")
    c = seq_len // parts
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    if scheme == "contiguous":
        return first
    last = parts - 1 - rank
    return torch.cat([first, torch.arange(last * c, (last + 1) * c, device=device)])


def shard(x: Tensor, group=None, *, seq_dim: int, scheme: str = "zigzag") -> Tensor:
    """This rank's shard of a global tensor (no communication)."""
    _, world, rank = _group_info(group)
    return x.index_select(seq_dim, shard_index(x.shape[seq_dim], world, rank, scheme, x.device))


def unshard(x: Tensor, group=None, *, seq_dim: int, scheme: str = "zigzag") -> Tensor:
    """The global tensor from every rank's shard (an all-gather; every rank gets it)."""
    g, world, _ = _group_info(group)
    local = x.contiguous()
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local, group=g)
    return _to_global_order(torch.cat(parts, seq_dim), world, scheme, seq_dim)


def _to_global_order(rank_major: Tensor, world: int, scheme: str, seq_dim: int) -> Tensor:
    """Rows concatenated rank by rank -> global sequence order."""
    s = rank_major.shape[seq_dim]
    held = torch.cat([shard_index(s, world, j, scheme, rank_major.device) for j in range(world)])
    return rank_major.index_select(seq_dim, torch.argsort(held))


def _to_rank_major(global_rows: Tensor, world: int, scheme: str, seq_dim: int) -> Tensor:
    s = global_rows.shape[seq_dim]
    held = torch.cat([shard_index(s, world, j, scheme, global_rows.device) for j in range(world)])
    return global_rows.index_select(seq_dim, held)


# ---------------------------------------------------------------------------------------------
# Kernel calls (BSND views; the only place that needs attnops' CPU kernels)


def _attn(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float):
    """(out, max, sum) with the statistics as [B,S,N,1] fp32. causal = bottom-right."""
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    out, mx, sm = _ops.flash_attention_score(q, k, v, None, None, mask, None, None, None, None, None, None, scale, 1.0,
                                             INT32_MAX, nxt, q.shape[2], "BSND", 0, mode, 1, 0, 0)
    return out, mx[..., :1].transpose(1, 2), sm[..., :1].transpose(1, 2)


def _attn_grad(q, k, v, dout, mx, sm, out, causal: bool, scale: float):
    """(dq, dk, dv) from the global statistics mx/sm ([B,S,N,1]) and the global output."""
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    stats = [x.transpose(1, 2).contiguous() for x in (mx, sm)]
    dq, dk, dv, _ = _ops.flash_attention_score_grad(q, k, v, dout, None, None, mask, stats[0], stats[1], out, None, None,
                                                    None, None, None, None, scale, 1.0, INT32_MAX, nxt, q.shape[2],
                                                    "BSND", 0, mode, 1, 0, 0)
    return dq, dk, dv


def _pack(*ts: Tensor, dtype=None) -> Tensor:
    return torch.cat([t.reshape(-1) for t in ts]).to(dtype or ts[0].dtype)


def _unpack(flat: Tensor, *shapes):
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[at:at + n].view(shape))
        at += n
    return out


# ---------------------------------------------------------------------------------------------
# Ring


class _Ring:
    """Sends to the next rank and receives from the previous one, both posted at once."""

    def __init__(self, g, world: int, rank: int):
        self.g = g
        self.next = dist.get_global_rank(g, (rank + 1) % world)
        self.prev = dist.get_global_rank(g, (rank - 1) % world)

    def start(self, send: Tensor, recv: Tensor, kind: str):
        comm_stats.record(kind, send)
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.next, self.g),
                                       dist.P2POp(dist.irecv, recv, self.prev, self.g)])

    @staticmethod
    def wait(reqs) -> None:
        t0 = time.perf_counter()
        for req in reqs:
            req.wait()
        comm_stats.wait_s += time.perf_counter() - t0


def _ring_block(scheme: str, causal: bool, rank: int, src: int, s_local: int):
    """(local query rows, rows of src's K/V, causal) of the step that holds rank src's K/V, or
    None when no query of this rank sees any of those keys."""
    full = slice(0, s_local)
    if not causal:
        return full, full, False
    if src == rank:
        return full, full, True
    if scheme == "contiguous":
        return (full, full, False) if src < rank else None
    # zigzag: this rank holds chunks (rank, 2W-1-rank), src holds (src, 2W-1-src).
    half = s_local // 2
    if src < rank:  # both local chunks come after src's first chunk and before its second
        return full, slice(0, half), False
    return slice(half, s_local), full, False  # only the second local chunk sees src's chunks


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, scheme, g, world, rank):
        ring = _Ring(g, world, rank)
        b, s, n, _ = q.shape
        qc = q.float()
        out = q.new_zeros((b, s, n, v.shape[3]), dtype=torch.float32)
        mx = q.new_full((b, s, n, 1), -math.inf, dtype=torch.float32)
        sm = q.new_zeros((b, s, n, 1), dtype=torch.float32)
        cur = _pack(k, v)
        nxt = torch.empty_like(cur)
        for step in range(world):
            reqs = ring.start(cur, nxt, "kv") if step + 1 < world else []
            block = _ring_block(scheme, causal, rank, (rank - step) % world, s)
            if block is not None:
                qr, kr, blk_causal = block
                kk, vv = _unpack(cur, k.shape, v.shape)
                o, m, l = _attn(qc[:, qr], kk[:, kr].float(), vv[:, kr].float(), blk_causal, scale)
                out[:, qr], mx[:, qr], sm[:, qr] = merge_max_sum(out[:, qr], mx[:, qr], sm[:, qr], o, m, l)
            _Ring.wait(reqs)
            cur, nxt = nxt, cur
        ctx.save_for_backward(q, k, v, out, mx, sm)
        ctx.cfg = (scale, causal, scheme, g, world, rank)
        ctx.mark_non_differentiable(mx, sm)
        return out.to(q.dtype), mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm = ctx.saved_tensors
        scale, causal, scheme, g, world, rank = ctx.cfg
        ring = _Ring(g, world, rank)
        s = q.shape[1]
        qc, doc = q.float(), dout.float()
        dq = torch.zeros_like(qc)
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
            block = _ring_block(scheme, causal, rank, (rank - step) % world, s)
            if block is not None:
                qr, kr, blk_causal = block
                kk, vv = _unpack(cur, k.shape, v.shape)
                dq_b, dk_b, dv_b = _attn_grad(qc[:, qr], kk[:, kr].float(), vv[:, kr].float(), doc[:, qr],
                                              mx[:, qr], sm[:, qr], out[:, qr], blk_causal, scale)
                dq[:, qr] += dq_b
                lk, lv = _unpack(local, k.shape, v.shape)
                lk[:, kr] += dk_b
                lv[:, kr] += dv_b
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
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


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


def _all_gather_kv(k, v, g, world, scheme):
    """Global K and V (fp32, global sequence order) from every rank's shard."""
    local = _pack(k, v)
    gathered = local.new_empty(world * local.numel())  # gloo wants the flat form
    comm_stats.record("allgather_kv", local)
    t0 = time.perf_counter()
    dist.all_gather_into_tensor(gathered, local, group=g)
    comm_stats.wait_s += time.perf_counter() - t0
    gathered = gathered.view(world, -1)
    ks, vs = zip(*(_unpack(gathered[j], k.shape, v.shape) for j in range(world)))
    kg = _to_global_order(torch.cat(ks, 1), world, scheme, 1).float()
    vg = _to_global_order(torch.cat(vs, 1), world, scheme, 1).float()
    return kg, vg


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, scheme, g, world, rank):
        kg, vg = _all_gather_kv(k, v, g, world, scheme)
        b, s, n, _ = q.shape
        qc = q.float()
        out = q.new_empty((b, s, n, v.shape[3]), dtype=torch.float32)
        mx = q.new_empty((b, s, n, 1), dtype=torch.float32)
        sm = torch.empty_like(mx)
        for rows, end, blk_causal in _query_chunks(scheme, causal, world, rank, s):
            out[:, rows], mx[:, rows], sm[:, rows] = _attn(qc[:, rows], kg[:, :end], vg[:, :end], blk_causal, scale)
        ctx.save_for_backward(q, k, v, out, mx, sm)
        ctx.cfg = (scale, causal, scheme, g, world, rank)
        ctx.mark_non_differentiable(mx, sm)
        return out.to(q.dtype), mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm = ctx.saved_tensors
        scale, causal, scheme, g, world, rank = ctx.cfg
        kg, vg = _all_gather_kv(k, v, g, world, scheme)  # gathered again rather than kept: W x less memory
        qc, doc = q.float(), dout.float()
        dq = torch.empty_like(qc)
        dkg, dvg = torch.zeros_like(kg), torch.zeros_like(vg)
        for rows, end, blk_causal in _query_chunks(scheme, causal, world, rank, q.shape[1]):
            dq[:, rows], dk_b, dv_b = _attn_grad(qc[:, rows], kg[:, :end], vg[:, :end], doc[:, rows], mx[:, rows],
                                                 sm[:, rows], out[:, rows], blk_causal, scale)
            dkg[:, :end] += dk_b
            dvg[:, :end] += dv_b
        # Reduce-scatter: every rank's share of each shard, exchanged all-to-all, summed in rank order.
        dk_parts = _to_rank_major(dkg, world, scheme, 1).chunk(world, 1)
        dv_parts = _to_rank_major(dvg, world, scheme, 1).chunk(world, 1)
        send = torch.stack([_pack(a, b) for a, b in zip(dk_parts, dv_parts)])
        recv = torch.empty_like(send)
        comm_stats.record("reduce_scatter_dkv", send)
        t0 = time.perf_counter()
        dist.all_to_all_single(recv, send, group=g)
        comm_stats.wait_s += time.perf_counter() - t0
        total = recv[0].clone()
        for j in range(1, world):
            total += recv[j]
        dk, dv = _unpack(total, k.shape, v.shape)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------
# Ulysses


def _a2a(send: Tensor, g, kind: str) -> Tensor:
    send = send.contiguous()
    recv = torch.empty_like(send)
    comm_stats.record(kind, send)
    t0 = time.perf_counter()
    dist.all_to_all_single(recv, send, group=g)
    comm_stats.wait_s += time.perf_counter() - t0
    return recv


def _seq_to_heads(x: Tensor, g, world: int) -> Tensor:
    """[B, S_local, N, D] (rows of this rank, all heads) -> [B, W*S_local, N/W, D] (rows of every
    rank, rank-major; this rank's head group)."""
    b, s, n, d = x.shape
    recv = _a2a(x.reshape(b, s, world, n // world, d).permute(2, 0, 1, 3, 4), g, "alltoall")
    return recv.permute(1, 0, 2, 3, 4).reshape(b, world * s, n // world, d)


def _heads_to_seq(y: Tensor, g, world: int) -> Tensor:
    """The inverse of _seq_to_heads."""
    b, sw, n, d = y.shape
    recv = _a2a(y.reshape(b, world, sw // world, n, d).permute(1, 0, 2, 3, 4), g, "alltoall")
    return recv.permute(1, 2, 0, 3, 4).reshape(b, sw // world, world * n, d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, world):
        ctx.cfg = (g, world)
        return _seq_to_heads(x, g, world)

    @staticmethod
    def backward(ctx, dy):
        return _heads_to_seq(dy, *ctx.cfg), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, g, world):
        ctx.cfg = (g, world)
        return _heads_to_seq(y, g, world)

    @staticmethod
    def backward(ctx, dx):
        return _seq_to_heads(dx, *ctx.cfg), None, None


def _ulysses(q, k, v, scale, causal, scheme, g, world, rank):
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
    if causal:  # the causal mask needs the global order; a full mask does not care
        s = qh.shape[1]
        held = torch.cat([shard_index(s, world, j, scheme, q.device) for j in range(world)])
        order, inverse = torch.argsort(held), held
        qh, kh, vh = (t.index_select(1, order) for t in (qh, kh, vh))
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    out, mx, sm = _ops.flash_attention_score(qh, kh, vh, None, None, mask, None, None, None, None, None, None, scale,
                                             1.0, INT32_MAX, nxt, qh.shape[2], "BSND", 0, mode, 1, 0, 0)
    stats = torch.cat([mx[..., :1], sm[..., :1]], 3).transpose(1, 2)  # [B, S, N/W, 2]
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
              causal: bool = False, group=None, comm: str = "ring", scheme: str = "zigzag"):
    """Attention over the global sequence, called with this rank's shards (held as ``scheme``
    says). Differentiable in query, key and value. Returns (out in the input layout, softmax_max,
    softmax_sum), the statistics fp32 [B, N, S_local] (global rows: exact for the whole
    sequence). causal: self-attention, each global query sees keys at or before its position.

    Every rank of the group must call it with the same shapes and arguments."""
    g, world, rank = _group_info(group)
    if comm not in COMMS:
        raise ValueError(f"comm = {comm!r}: must be one of {', '.join(COMMS)}")
    _check_scheme(scheme)
    if input_layout not in SEQ_DIM:
        raise ValueError(f"input_layout = {input_layout!r}: must be one of {', '.join(SEQ_DIM)} under context "
                         "parallelism (TND is not supported yet)")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise ValueError(f"{name}: dtype {t.dtype}: must equal query's {query.dtype}")
    q = _bsnd(query, input_layout, head_num, "query")
    # BSH/SBH name only the query heads: K/V heads follow from the head size (GQA).
    d = q.shape[3]
    nk = key.shape[2] // d if input_layout in ("BSH", "SBH") else 0
    k = _bsnd(key, input_layout, nk, "key")
    v = _bsnd(value, input_layout, k.shape[2], "value")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"key/value: local sequence lengths {k.shape[1]}/{v.shape[1]}: must equal query's "
                         f"{q.shape[1]} (self-attention shards)")
    if scheme == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"query: local sequence length {q.shape[1]}: must be even for scheme 'zigzag' (two chunks)")
    if world == 1:
        out, mx, sm = _attn_plain(query, key, value, head_num, input_layout, scale, causal)
        return out, mx, sm
    if comm == "ring":
        out, mx, sm = _RingAttention.apply(q, k, v, scale, causal, scheme, g, world, rank)
    elif comm == "allgather":
        out, mx, sm = _AllGatherAttention.apply(q, k, v, scale, causal, scheme, g, world, rank)
    else:
        out, mx, sm = _ulysses(q, k, v, scale, causal, scheme, g, world, rank)
    return _from_bsnd(out, input_layout), mx[..., 0].transpose(1, 2), sm[..., 0].transpose(1, 2)


def _attn_plain(query, key, value, head_num, layout, scale, causal):
    """W = 1: the plain op in the caller's layout, bit for bit."""
    mode, nxt, mask = (3, 0, _CAUSAL_MASK) if causal else (0, INT32_MAX, None)
    out, mx, sm = _ops.flash_attention_score(query, key, value, None, None, mask, None, None, None, None, None, None,
                                             scale, 1.0, INT32_MAX, nxt, head_num, layout, 0, mode, 1, 0, 0)
    return out, mx[..., 0], sm[..., 0]


def npu_fusion_attention(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                         pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                         atten_mask: Optional[Tensor] = None, scale: float = 1.0, keep_prob: float = 1.0,
                         pre_tockens: int = INT32_MAX, next_tockens: int = INT32_MAX, inner_precise: int = 0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode: int = 0,
                         gen_mask_parallel: bool = True, sync: bool = False, *, group=None, comm: str = "ring",
                         scheme: str = "zigzag"):
    """torch_npu.npu_fusion_attention over the sequence shards of a group: the 7-tuple (out,
    softmax_max, softmax_sum, softmax_out, seed, offset, numels), the statistics [B,N,S_local,8]
    for this rank's rows. Masks: atten_mask None (full attention, whatever sparse_mode says, as in
    torch_npu) or sparse_mode 2/3 with the compressed causal mask. With a group of one process
    this is the plain op."""
    g, world, _ = _group_info(group)
    for name, val in (("pse", pse), ("padding_mask", padding_mask), ("prefix", prefix),
                      ("actual_seq_qlen", actual_seq_qlen), ("actual_seq_kvlen", actual_seq_kvlen)):
        if val is not None:
            raise ValueError(f"{name}: given: not supported under context parallelism, must be None")
    if keep_prob != 1.0:
        raise ValueError(f"keep_prob = {keep_prob}: dropout is not supported under context parallelism yet, must be 1")
    if atten_mask is not None and sparse_mode not in (2, 3):
        raise ValueError(f"atten_mask with sparse_mode = {sparse_mode}: under context parallelism a mask must be the "
                         "compressed causal one (sparse_mode 2 or 3); pass atten_mask=None for full attention")
    causal = atten_mask is not None
    if world == 1:
        return _plain_npu_fusion_attention(query, key, value, head_num, input_layout, atten_mask=atten_mask,
                                           scale=scale, pre_tockens=pre_tockens, next_tockens=next_tockens,
                                           inner_precise=inner_precise, sparse_mode=sparse_mode)
    out, mx, sm = attention(query, key, value, head_num, input_layout, scale=scale, causal=causal, group=g, comm=comm,
                            scheme=scheme)
    lanes = _ops.STAT_LANES
    return (out, mx[..., None].expand(*mx.shape, lanes).contiguous(), sm[..., None].expand(*sm.shape, lanes).contiguous(),
            query.new_empty((0,)), 0, 0, 0)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, group=None, comm: str = "ring", scheme: str = "zigzag"):
    """flash_attn_func over the sequence shards of a group: q/k/v [B, S_local, H, D] -> out
    [B, S_local, H, D] (and softmax_lse [B, H, S_local] with return_attn_probs). With a group of
    one process this is attnops.torch.flash_attn_func."""
    g, world, _ = _group_info(group)
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p = {dropout_p}: dropout is not supported under context parallelism yet, must be 0")
    if tuple(window_size) != (-1, -1) or softcap != 0.0 or alibi_slopes is not None:
        raise ValueError(f"window_size = {tuple(window_size)}, softcap = {softcap}, alibi_slopes: not supported under "
                         "context parallelism (must be (-1, -1), 0.0, None)")
    if world == 1:
        return _plain_flash_attn_func(q, k, v, 0.0, softmax_scale, causal, return_attn_probs=return_attn_probs)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, mx, sm = attention(q, k, v, q.shape[2], "BSND", scale=scale, causal=causal, group=g, comm=comm, scheme=scheme)
    if return_attn_probs:
        return out, (mx + torch.log(sm)).detach(), None
    return out
