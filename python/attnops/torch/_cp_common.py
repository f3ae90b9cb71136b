"""What attnops.torch.cp and its block-wise path (attnops.torch._cp_general) share: the
communication statistics, the flat packing of several tensors into one transfer, the ring's
point-to-point exchange, Ulysses' all-to-alls between sequence shards and head shards, and the
rank-ordered sum of a replicated parameter's gradient. Both modules import this one; cp imports
_cp_general, which no longer imports cp (no import cycle)."""

from __future__ import annotations

import math
import time
from collections import Counter

import torch
import torch.distributed as dist
from torch import Tensor


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


def _pack(*ts: Tensor, dtype=None) -> Tensor:
    return torch.cat([t.reshape(-1) for t in ts]).to(dtype or ts[0].dtype)


def _unpack(flat: Tensor, *shapes):
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[at:at + n].view(shape))
        at += n
    return out


class _Ring:
    def __init__(self, g, world: int, rank: int):
        self.g, self.world, self.rank = g, world, rank
        self.next = dist.get_global_rank(g, (rank + 1) % world)
        self.prev = dist.get_global_rank(g, (rank - 1) % world)

    def start(self, send: Tensor, recv: Tensor, kind: str, hops: int = 0):
        """Sends to the next rank and receives from the previous one; with ``hops`` (the
        early-stopped ring's last dK/dV transfer) sends ``hops`` ranks back and receives from
        ``hops`` ranks ahead."""
        comm_stats.record(kind, send)
        dst, src = self.next, self.prev
        if hops:
            dst = dist.get_global_rank(self.g, (self.rank - hops) % self.world)
            src = dist.get_global_rank(self.g, (self.rank + hops) % self.world)
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, dst, self.g),
                                       dist.P2POp(dist.irecv, recv, src, self.g)])

    @staticmethod
    def wait(reqs) -> None:
        t0 = time.perf_counter()
        for req in reqs:
            req.wait()
        comm_stats.wait_s += time.perf_counter() - t0


def _gather_sum(x: Tensor, g, world: int) -> Tensor:
    """The sum over the ranks of x, added in rank order (every rank gets the same bits)."""
    if world == 1:
        return x
    parts = x.new_empty((world,) + tuple(x.shape))
    comm_stats.record("allgather_dsink", x)
    dist.all_gather_into_tensor(parts.view(-1), x.contiguous().view(-1), group=g)
    total = parts[0].clone()
    for j in range(1, world):
        total += parts[j]
    return total


class ReplicatedGrad(torch.autograd.Function):
    """Identity on a parameter every rank holds (a sink); the backward sums every rank's
    gradient in rank order, so each rank gets the gradient of the whole sequence."""

    @staticmethod
    def forward(ctx, x, g, world):
        ctx.cfg = (g, world)
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return _gather_sum(dy.contiguous(), *ctx.cfg), None, None


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
