"""Context parallelism for everything beyond "no mask or causal": sparse modes 0-8 (bands,
prefixes, the TND split modes 7/8, explicit masks: TND in its [maxSq, maxSkv] and [T1, T2] forms),
learnable sinks, pse (alibi slopes from global positions, dense pse sliced per block: TND's
flattened forms cut into per-sequence [N, Sq_i|1, Skv_i] blocks first; the compressed 1024-row
alibi form expanded into each block's dense bias from its global positions), and the
Ulysses-inside, ring-across hybrid.

One mechanism serves all of them. Every row a rank holds has a global position (a sequence and
a position in it); the rows of a shard form a few contiguous runs (one for "contiguous", two for
"zigzag", two per packed sequence for TND). The attention a rank computes is a set of blocks,
(a run of its queries) x (a run of keys that travels to it), and for each block the global mask
rule (a band lo <= j - i <= hi on global positions, a prefix, an explicit mask) is turned into
the kernel's terms for that block alone:
- no key of the block is visible: the block is skipped (no kernel call, nothing merged);
- every key is visible: a plain call (sparse mode 0, no mask);
- a band cuts the block: the block is first trimmed to the rows and keys the band touches, then
  called with sparse mode 4 (bottom-right band) and preTokens/nextTokens rewritten for the
  block's own origin, so that the kernel skips what the band excludes;
- a prefix or an explicit mask: an explicit per-call mask (sparse mode 0), [B|1, N|1, a, c].
Alibi slopes (pseType 2/3) get qStartIdx/kvStartIdx = the block's global starts, so the bias is
that of global positions; a dense pse is sliced like the mask. Dropout: each block's call names
the global position of its first row and key (and, packed, its global sequence, the block being
called in TND layout), so the kernels draw the single-process op's keep bits. Cross-attention
(S1 != S2; TND: per-sequence lengths): query and key rows have positions (and, TND, sequence
starts) of their own, the bottom-right modes' band is shifted by S2 - S1 (per sequence). Rows
at position -1 are padding (uneven "llama3" slices) and belong to no block.

The partial results merge in fp32 by their statistics (attnops.torch.merge). A sink enters once,
after the last block (a block of one key whose score is the sink and whose value is 0), never once
per block; its gradient dsink = -sum_rows P_sink * rowsum(dO o O) is summed over the ranks in rank
order and returned complete on every rank (the sink is replicated, so every replica gets the
gradient of the whole sequence).

Transfers: "ring" sends K/V around the ring and dK/dV one hop behind, for as many steps as some
rank has a block to compute (every rank derives that number from the global rule; a band behind
the diagonal over contiguous shards needs 2), after which the dK/dV accumulators go home in one
direct hop; "allgather" gathers K/V once (in global
order, so that each sequence is one run of keys), dK/dV return by an all-to-all summed in rank
order. With an inner ``ulysses_group``, queries, keys and values first go from sequence shards to
head shards inside that group, the ring or all-gather then runs across ``group`` over the inner
group's joint rows, and the output comes back by the reverse all-to-all.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import _ops
from ._cp_common import _gather_sum, _HeadsToSeq, _heads_to_seq, _pack, _Ring, _SeqToHeads, _unpack
from ._cp_common import comm_stats
from .merge import merge_max_sum

INT32_MAX = _ops.INT32_MAX
UNBOUNDED = 1 << 60
_BAND_MASK = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # compressed mask for mode 4 (not read)
# Kernel calls of the block-wise path ("fwd", "bwd"), for tests: skipped blocks make none.
kernel_calls = Counter()


def _clamp_tokens(x: int) -> int:
    return max(-UNBOUNDED, min(UNBOUNDED, int(x)))


# ---------------------------------------------------------------------------------------------
# The global mask rule


@dataclass
class Geometry:
    """What a query at global position i (in its sequence) sees of the keys j of its sequence:
    lo <= j - i <= hi (the band; per sequence for TND modes 7/8 and TND cross-attention), or
    j < prefix[b]; and not where the explicit mask is True. Plus the position bias."""

    lo: int = -UNBOUNDED
    hi: int = UNBOUNDED
    seq_bands: dict = field(default_factory=dict)  # sequence -> (lo, hi), overrides (TND)
    prefix: Optional[List[int]] = None  # per batch (fixed layouts) or per sequence (TND)
    mask: Optional[Tensor] = None  # global, True = masked: [S, S] or [B|1, N|1, S, S]; TND: 2-D
    mask_origin: Optional[list] = None  # TND: per sequence, the mask's (row, column) of its (0, 0)
    pse: Optional[Tensor] = None  # pse_type 2/3: slopes [N] / [B, N]; 0/1: [B|1, N, S|1, S]
    pse_type: int = 1
    tnd: bool = False
    drop: Optional["DropSpec"] = None  # dropout keyed by global positions, or None
    seq_pse: Optional[list] = None  # TND dense pse: per sequence [N, Sq_i | 1, Skv_i] views
    alibi_start: tuple = (0, 0)  # pse_type 2/3: (qStartIdx, kvStartIdx) of the global problem
    pse_compressed: bool = False  # pse_type 0/1: the compressed alibi form [B|1, N, 1024, W] (expanded per block)

    def band(self, seq: int):
        return self.seq_bands.get(seq, (self.lo, self.hi))

    def heads(self, h0: int, h1: int, n: int) -> "Geometry":
        """The rule for query heads [h0, h1) of n (Ulysses): per-head tensors sliced."""
        mask, pse, seq_pse = self.mask, self.pse, self.seq_pse
        if mask is not None and mask.dim() == 4 and mask.shape[1] == n:
            mask = mask[:, h0:h1]
        if seq_pse is not None:
            seq_pse = [p[h0:h1] for p in seq_pse]
        elif pse is not None:
            pse = pse[..., h0:h1] if self.pse_type >= 2 else pse[:, h0:h1]
        drop = self.drop._replace(head_offset=self.drop.head_offset + h0) if self.drop is not None else None
        return Geometry(self.lo, self.hi, self.seq_bands, self.prefix, mask, self.mask_origin, pse, self.pse_type,
                        self.tnd, drop, seq_pse, self.alibi_start, self.pse_compressed)


class DropSpec(NamedTuple):
    """Dropout on the block-wise path: the keep bit of every element is the one of the global
    problem (the kernels key the Philox counter by global positions, flash_attention_score_ex.h),
    so a block draws exactly what the single-process op draws for its (row, key) pairs.
    heads: global N1 (head_offset: the first head of this call, Ulysses); q_len/kv_len: the
    global S1/S2 (fixed layouts); cum: the global cumulative lengths (TND, no leading 0)."""

    keep_prob: float
    seed: int
    offset: int
    heads: int
    head_offset: int = 0
    q_len: int = 0
    kv_len: int = 0
    cum: Optional[Tensor] = None
    kv_cum: Optional[Tensor] = None  # TND cross-attention: the keys' cumulative lengths (else cum)


def geometry(sparse_mode: int, pre_tokens: int, next_tokens: int, atten_mask: Optional[Tensor], prefix,
             pse: Optional[Tensor], pse_type: int, *, batch: int, heads: int, seq_len: int, lengths=None,
             kv_len: Optional[int] = None, kv_lengths=None, q_start_idx: int = 0, kv_start_idx: int = 0) -> Geometry:
    """The global rule of a call, validated. Self-attention (Sq = Skv: top-left and bottom-right
    origins coincide) or, with ``kv_len`` != seq_len (fixed layouts) or ``kv_lengths`` !=
    ``lengths`` (TND, per sequence), cross-attention: the bottom-right modes 3/4/5/6/7 (and mode
    8's band) shifted by d = Skv - Sq (per sequence for TND), as the plain op does; ``lengths``:
    the packed sequences' lengths (TND). q_start_idx/kv_start_idx: the alibi offsets (pse_type
    2/3) of the global problem."""
    tnd = lengths is not None
    if sparse_mode not in range(9):
        raise ValueError(f"sparse_mode = {sparse_mode}: must be in [0, 8]")
    kv_len = seq_len if kv_len is None else kv_len
    d = kv_len - seq_len
    q_lens = list(lengths) if tnd else []
    kv_lens = list(kv_lengths) if tnd and kv_lengths is not None else q_lens
    if sparse_mode in (7, 8) and not tnd:
        raise ValueError(f"sparse_mode = {sparse_mode}: modes 7 and 8 split packed sequences; they need input_layout "
                         "TND")
    if sparse_mode == 5 and tnd:
        raise ValueError("sparse_mode = 5: not available with input_layout TND (use mode 6)")
    pre, nxt = _clamp_tokens(pre_tokens), _clamp_tokens(next_tokens)
    if sparse_mode in (0, 4, 7, 8) and pre + nxt < 0:
        raise ValueError(f"pre_tokens + next_tokens = {pre_tokens} + {next_tokens}: must be >= 0 (the band "
                         "-pre_tokens <= j - i <= next_tokens would be empty)")
    g = Geometry(tnd=tnd)
    if sparse_mode == 0:
        g.lo, g.hi = -pre, nxt
    elif sparse_mode == 4:  # bottom-right: -pre <= j - i - d <= next
        g.lo, g.hi = _clamp_tokens(d - pre), _clamp_tokens(d + nxt)
    elif sparse_mode in (3, 5, 6, 7):
        g.lo, g.hi = -UNBOUNDED, d
    elif sparse_mode in (2, 8):
        g.lo, g.hi = -UNBOUNDED, 0
    if tnd and kv_lens != q_lens and sparse_mode in (3, 4, 6, 7):
        # Bottom-right: every sequence's band shifted by its own d.
        for s, (nq, nk) in enumerate(zip(q_lens, kv_lens)):
            ds = nk - nq
            g.seq_bands[s] = ((_clamp_tokens(ds - pre), _clamp_tokens(ds + nxt)) if sparse_mode == 4 else
                              (-UNBOUNDED, ds))
    if sparse_mode in (7, 8):  # the band sequence: the last / first with queries and keys
        live = [i for i, (nq, nk) in enumerate(zip(q_lens, kv_lens)) if nq > 0 and nk > 0]
        if live:
            s = live[-1] if sparse_mode == 7 else live[0]
            ds = kv_lens[s] - q_lens[s]
            g.seq_bands[s] = (_clamp_tokens(ds - pre), _clamp_tokens(ds + nxt))
    if sparse_mode in (5, 6):
        count = len(lengths) if tnd else batch
        if prefix is None:
            raise ValueError(f"prefix: None: required with sparse_mode {sparse_mode}")
        values = [int(x) for x in (prefix.tolist() if isinstance(prefix, Tensor) else prefix)]
        if len(values) != count:
            raise ValueError(f"prefix: {len(values)} values: must be one per {'sequence' if tnd else 'batch'} "
                             f"({count})")
        for b, p in enumerate(values):
            nq, nk = (q_lens[b], kv_lens[b]) if tnd else (seq_len, kv_len)
            low = 0 if nq > nk else nk - nq  # the plain op's rule
            if not low <= p <= nk:
                raise ValueError(f"prefix[{b}] = {p}: must be in [{low}, {nk}]" +
                                 (f" (Sq = {nq}, Skv = {nk})" if nq != nk else ""))
        g.prefix = values
    elif prefix is not None:
        raise ValueError(f"prefix: given: only used with sparse_mode 5 or 6 (got {sparse_mode})")
    if atten_mask is not None and sparse_mode in (0, 1, 5):
        if atten_mask.dtype not in (torch.bool, torch.uint8):
            raise ValueError(f"atten_mask: dtype {atten_mask.dtype}: must be bool or uint8")
        if tnd:
            g.mask, g.mask_origin = _tnd_mask_geometry(atten_mask, q_lens, kv_lens, sparse_mode)
        else:
            shape = tuple(atten_mask.shape)
            ok = shape == (seq_len, kv_len) or (len(shape) == 4 and shape[2:] == (seq_len, kv_len) and (
                (shape[0] == batch and shape[1] in (1, heads)) or shape[:2] == (1, 1)))
            if not ok:
                raise ValueError(f"atten_mask: shape {list(shape)}: with sparse_mode {sparse_mode} under context "
                                 f"parallelism it is the global mask, [S1, S2], [B, N|1, S1, S2] or [1, 1, S1, S2] "
                                 f"with S1 = {seq_len}, S2 = {kv_len}")
            g.mask = atten_mask.bool()
    if pse is not None:
        if pse_type in (2, 3):
            if pse.dtype != torch.float32 or tuple(pse.shape) not in ((heads,), (batch, heads)) or \
                    (tnd and pse.dim() != 1):
                raise ValueError(f"pse: shape {list(pse.shape)} dtype {pse.dtype}: with pse_type {pse_type} must be fp32 "
                                 f"slopes [N] = [{heads}]" + ("" if tnd else f" or [B, N] = [{batch}, {heads}]"))
            g.alibi_start = (int(q_start_idx), int(kv_start_idx))
        elif pse_type in (0, 1):
            if compressed_alibi(pse, sparse_mode, atten_mask, next_tokens, batch=batch, heads=heads,
                                seq_len=seq_len, kv_len=kv_len, lengths=q_lens if tnd else None, kv_lengths=kv_lens):
                g.pse_compressed = True  # expanded per block from the global positions (_pse_args)
            elif tnd:
                g.seq_pse = _tnd_pse_blocks(pse, heads, q_lens, kv_lens, pse_type)
            else:
                shape = tuple(pse.shape)
                if not (len(shape) == 4 and shape[0] in (1, batch) and shape[1] == heads and shape[2] in (1, seq_len)
                        and shape[3] == kv_len):
                    sizes = f"S = {seq_len}" if kv_len == seq_len else f"S1 = {seq_len}, S2 = {kv_len}"
                    form = "[B|1, N, S|1, S]" if kv_len == seq_len else "[B|1, N, S1|1, S2]"
                    raise ValueError(f"pse: shape {list(shape)}: with pse_type {pse_type} under context parallelism it "
                                     f"is the global bias {form} with {sizes}, or the compressed alibi form "
                                     f"[B|1, N, 1024, S2] (S1 == S2 > 1024)")
        else:
            raise ValueError(f"pse_type = {pse_type}: must be 0, 1, 2 or 3")
        g.pse, g.pse_type = pse, pse_type
    elif pse_type != 1:
        raise ValueError(f"pse_type = {pse_type}: must be 1 when pse is None")
    return g


COMPRESSED_ROWS = 1024  # the compressed alibi form holds the last 1024 rows of the bias (spec 2.5)


def compressed_alibi(pse: Tensor, sparse_mode: int, atten_mask: Optional[Tensor], next_tokens: int, *, batch: int,
                     heads: int, seq_len: int, kv_len: int, lengths=None, kv_lengths=None) -> bool:
    """Whether a pse_type 0/1 ``pse`` is the compressed alibi form [B|1, N, 1024, W] of the
    global problem (spec 2.5: the last 1024 rows of a Toeplitz alibi bias; the bias of query i
    and key j of a sequence is pse[b, n, 1023, W - 1 - (i - j)] for 0 <= i - j < W, and no key
    after its query is visible), checked by the plain op's rules: S1 == S2 > 1024 and W == S2
    (fixed layouts), Sq_i == Skv_i <= W for every sequence (TND: ``lengths``/``kv_lengths``, the
    batch dim one per sequence), and a lower-triangular mask (sparse mode 2 or 3, or 0 with an
    explicit mask and next_tokens <= 0). False for the dense forms (a [B|1, N, 1024, S2] pse with
    S1 = 1024 is dense, as in the plain op)."""
    tnd = lengths is not None
    if pse.dim() != 4 or pse.shape[2] != COMPRESSED_ROWS:
        return False
    if not tnd and pse.shape[3] == kv_len and seq_len == COMPRESSED_ROWS:
        return False  # the dense [B|1, N, S1, S2] form
    count = len(lengths) if tnd else batch
    w = pse.shape[3]
    if pse.shape[0] not in (1, count) or pse.shape[1] != heads:
        raise ValueError(f"pse: shape {list(pse.shape)}: the compressed alibi form is [B|1, N, 1024, W] with "
                         f"{'B = the number of sequences' if tnd else 'B'} = {count}, N = {heads}")
    lower = sparse_mode in (2, 3) or (sparse_mode == 0 and atten_mask is not None and next_tokens <= 0)
    if not lower:
        raise ValueError(f"pse: shape {list(pse.shape)}: the compressed alibi form needs a lower-triangular mask "
                         f"(sparse_mode 2 or 3, or 0 with an explicit atten_mask and next_tokens <= 0); got "
                         f"sparse_mode {sparse_mode}" + (f", next_tokens {next_tokens}" if sparse_mode == 0 else "")
                         + ("" if sparse_mode != 0 or atten_mask is not None else ", no atten_mask"))
    if tnd:
        bad = [i for i, (a, b) in enumerate(zip(lengths, kv_lengths)) if a != b or b > w]
        if bad:
            i = bad[0]
            raise ValueError(f"pse: shape {list(pse.shape)}: the compressed alibi form needs Sq_i == Skv_i <= W = {w} "
                             f"for every sequence; sequence {i} has Sq = {lengths[i]}, Skv = {kv_lengths[i]}")
    elif not (seq_len > COMPRESSED_ROWS and seq_len == kv_len and w == kv_len):
        raise ValueError(f"pse: shape {list(pse.shape)}: the compressed alibi form [B|1, N, 1024, S2] needs S1 == S2 "
                         f"> 1024 and W == S2; got S1 = {seq_len}, S2 = {kv_len}")
    return True


def expand_compressed_alibi(pse: Tensor, q0: int, a: int, k0: int, c: int) -> Tensor:
    """The dense bias [B|1, N, a, c] of queries q0..q0+a-1 and keys k0..k0+c-1 (positions within
    their sequence) from the compressed alibi form [B|1, N, 1024, W]: pse[.., 1023, W - 1 - (i - j)]
    where 0 <= i - j < W, else 0 (keys after their query, which the form's mask hides), as the
    plain op reads it."""
    w = pse.shape[3]
    i = torch.arange(q0, q0 + a, device=pse.device)[:, None]
    j = torch.arange(k0, k0 + c, device=pse.device)[None, :]
    col = w - 1 - (i - j)
    inside = (col >= 0) & (col < w)
    vals = pse[:, :, COMPRESSED_ROWS - 1][:, :, col.clamp(0, w - 1)]
    return torch.where(inside, vals, torch.zeros((), dtype=vals.dtype))


def _tnd_mask_geometry(mask: Tensor, q_lens, kv_lens, sparse_mode: int):
    """(mask, per-sequence (query row, key column) origin) of a global TND mask: [maxSq, maxSkv]
    applies to every sequence from its first position (origin 0), [T1, T2] is indexed by packed
    rows (origin: the sequence's starts); the plain op's two forms, the first one preferred when
    both shapes match (spec 2.2: TND takes [maxSq, maxSkv] or [T1, T2])."""
    max_q, max_k = max(q_lens, default=0), max(kv_lens, default=0)
    t1, t2 = sum(q_lens), sum(kv_lens)
    shape = tuple(mask.shape)
    if shape == (max_q, max_k):
        origin = [(0, 0)] * len(q_lens)
    elif shape == (t1, t2):
        qs = torch.tensor([0] + q_lens).cumsum(0).tolist()
        ks = torch.tensor([0] + kv_lens).cumsum(0).tolist()
        origin = list(zip(qs[:-1], ks[:-1]))
    else:
        raise ValueError(f"atten_mask: shape {list(shape)}: with sparse_mode {sparse_mode} and input_layout TND under "
                         f"context parallelism it is the global mask, [maxSq, maxSkv] = [{max_q}, {max_k}] (every "
                         f"sequence from its start) or [T1, T2] = [{t1}, {t2}] (packed rows)")
    return mask.bool(), origin


def _tnd_pse_blocks(pse: Tensor, heads: int, q_lens, kv_lens, pse_type: int) -> List[Tensor]:
    """Per-sequence views [N, Sq_i | 1, Skv_i] of a global TND pse (pse_type 0/1): the flattened
    [sum N*Sq_i*Skv_i] form, or the row-broadcast [sum N*Skv_i] form (spec 2.5; the first one
    preferred when both sizes match, as the plain op does)."""
    dense = sum(heads * a * b for a, b in zip(q_lens, kv_lens))
    rows = sum(heads * b for b in kv_lens)
    if pse.dim() != 1 or pse.shape[0] not in (dense, rows):
        raise ValueError(f"pse: shape {list(pse.shape)}: with pse_type {pse_type} and input_layout TND under context "
                         f"parallelism it is the global bias [sum N*Sq_i*Skv_i] = [{dense}] or [sum N*Skv_i] = "
                         f"[{rows}], or the 4-D compressed alibi form [B|1, N, 1024, W]")
    broadcast = pse.shape[0] != dense
    out, at = [], 0
    for nq, nk in zip(q_lens, kv_lens):
        r = 1 if broadcast else nq
        out.append(pse[at:at + heads * r * nk].view(heads, r, nk))
        at += heads * r * nk
    return out


# ---------------------------------------------------------------------------------------------
# Runs and blocks


def runs(pos: Tensor, starts: Optional[List[int]]):
    """Contiguous runs of global positions ``pos`` (packed index, rows in local order):
    [sequence, start in the sequence, length, first local row]. ``starts``: the packed
    sequences' start offsets (TND), None for one sequence per batch row. Rows at position -1
    (padding) belong to no run."""
    out = []
    for r, x in enumerate(pos.tolist()):
        if x < 0:  # a padding row (uneven "llama3" slices): in no run, so in no block
            continue
        s = bisect.bisect_right(starts, x) - 1 if starts else 0
        off = x - starts[s] if starts else x
        if out and out[-1][0] == s and out[-1][1] + out[-1][2] == off and out[-1][3] + out[-1][2] == r:
            out[-1][2] += 1
        else:
            out.append([s, off, 1, r])
    return out


@dataclass
class Block:
    qr: int  # first local query row
    a: int  # query rows
    kr: int  # first row in the key buffer
    c: int  # keys
    q0: int  # global (in-sequence) positions of the first query and key
    k0: int
    mode: int = 0
    pre: int = INT32_MAX
    nxt: int = INT32_MAX
    mask: Optional[Tensor] = None  # explicit, True = masked
    seq: int = 0  # the (packed) sequence of the block


def plan(geom: Geometry, qruns, kruns) -> List[Block]:
    """The kernel calls of (query runs) x (key runs), in a fixed order; skipped blocks left out."""
    blocks = []
    for s, q0, a, qr in qruns:
        for s2, k0, c, kr in kruns:
            if s2 != s or a == 0 or c == 0:
                continue
            blk = _plan_one(geom, s, q0, a, qr, k0, c, kr)
            if blk is not None:
                blk.seq = s
                blocks.append(blk)
    return blocks


def _plan_one(geom: Geometry, s, q0, a, qr, k0, c, kr) -> Optional[Block]:
    lo, hi = geom.band(s)
    if geom.prefix is not None or geom.mask is not None:
        i = torch.arange(q0, q0 + a)[:, None]
        j = torch.arange(k0, k0 + c)[None, :]
        keep = ((j - i) >= lo) & ((j - i) <= hi)
        if geom.prefix is not None:
            pref = geom.prefix[s:s + 1] if geom.tnd else geom.prefix
            keep = keep | (j < torch.tensor(pref).view(-1, 1, 1, 1))
        if geom.mask is not None:
            qo, ko = geom.mask_origin[s] if geom.mask_origin is not None else (0, 0)
            m = geom.mask[..., qo + q0:qo + q0 + a, ko + k0:ko + k0 + c]
            keep = keep & ~m
        if not keep.any():
            return None
        if keep.all():
            return Block(qr, a, kr, c, q0, k0)
        return Block(qr, a, kr, c, q0, k0, mask=(~keep).contiguous())
    # The band: keys [q0 + lo, q0 + a - 1 + hi] touch some row, rows [k0 - hi, k0 + c - 1 - lo] some key.
    k_lo, k_hi = max(k0, q0 + lo), min(k0 + c - 1, q0 + a - 1 + hi)
    i_lo, i_hi = max(q0, k0 - hi), min(q0 + a - 1, k0 + c - 1 - lo)
    if k_hi < k_lo or i_hi < i_lo:
        return None
    qr, kr = qr + i_lo - q0, kr + k_lo - k0
    q0, a, k0, c = i_lo, i_hi - i_lo + 1, k_lo, k_hi - k_lo + 1
    shift = k0 - q0  # j - i = (local j) - (local i) + shift
    lo_l, hi_l = lo - shift, hi - shift
    if lo_l <= -(a - 1) and hi_l >= c - 1:
        return Block(qr, a, kr, c, q0, k0)
    d = c - a  # the kernel's band is bottom-right: -pre <= j - i - d <= next
    lo_l, hi_l = max(lo_l, -a), min(hi_l, c)
    return Block(qr, a, kr, c, q0, k0, 4, d - lo_l, hi_l - d)


# ---------------------------------------------------------------------------------------------
# Kernel calls (BSND: [B, rows, N, D])


def _pse_args(geom: Geometry, blk: Block, tnd_call: bool = False):
    """(pse, qStartIdx, kvStartIdx) of a block's call: alibi slopes with the block's global
    starts; a dense pse sliced to the block, [1|B, N, a|1, c] (flattened to the 1-D TND forms for a
    TND call: [N*a*c] or row-broadcast [N*c])."""
    if geom.pse is None:
        return None, None, None
    if geom.pse_type >= 2:
        return geom.pse, [geom.alibi_start[0] + blk.q0], [geom.alibi_start[1] + blk.k0]
    if geom.pse_compressed:  # the block's own bias from its global positions (TND: its sequence's batch row)
        p = geom.pse if not geom.tnd or geom.pse.shape[0] == 1 else geom.pse[blk.seq:blk.seq + 1]
        rows = expand_compressed_alibi(p, blk.q0, blk.a, blk.k0, blk.c).float().contiguous()
        return (rows.view(-1) if tnd_call else rows), None, None
    p = geom.pse if geom.seq_pse is None else geom.seq_pse[blk.seq][None]
    rows = p[:, :, :, blk.k0:blk.k0 + blk.c] if p.shape[2] == 1 else p[:, :, blk.q0:blk.q0 + blk.a, blk.k0:blk.k0 + blk.c]
    rows = rows.float().contiguous()  # the block-wise path calls the kernels in fp32
    return (rows.view(-1) if tnd_call else rows), None, None


def _mask_arg(blk: Block, batch: int):
    if blk.mode == 4:
        return _BAND_MASK
    m = blk.mask
    if m is not None and m.dim() == 4 and m.shape[0] == 1 and m.shape[1] != 1:
        m = m.expand(batch, -1, -1, -1).contiguous()  # the kernel takes [B,N,..], [B,1,..], [1,1,..]
    return m


def _drop_call(geom: Geometry, blk: Block):
    """(keep_prob, seed, offset, DropoutGeometry, TND) of a block under dropout: the block's rows and
    keys at their global positions. Packed sequences call the kernel in TND layout (one local
    sequence, the block, that is global sequence blk.seq): the TND keep bits are indexed per
    sequence, which a BSND call cannot reproduce."""
    d = geom.drop
    if geom.tnd:
        geo = _ops.DropoutGeometry(head_num=d.heads, head_offset=d.head_offset, q_row_offset=blk.q0,
                                   kv_row_offset=blk.k0, actual_seq_qlen=d.cum,
                                   actual_seq_kvlen=d.cum if d.kv_cum is None else d.kv_cum,
                                   seq_index=torch.tensor([blk.seq], dtype=torch.int64))
    else:
        geo = _ops.DropoutGeometry(head_num=d.heads, head_offset=d.head_offset, q_seq_len=d.q_len,
                                   kv_seq_len=d.kv_len, q_row_offset=blk.q0, kv_row_offset=blk.k0)
    return d.keep_prob, d.seed, d.offset, geo


def _tnd_mask(m):
    """A block's explicit mask for a TND call of one sequence: [a, c]."""
    return m if m is None or m.dim() == 2 else m.reshape(m.shape[-2], m.shape[-1])


def _fwd_drop(q, k, v, blk: Block, geom: Geometry, scale: float):
    pse, qs, ks = _pse_args(geom, blk, geom.tnd)
    keep, seed, offset, geo = _drop_call(geom, blk)
    mask = _mask_arg(blk, q.shape[0])
    kw = dict(drop=geo, pse=pse, q_start_idx=qs, kv_start_idx=ks, pse_type=geom.pse_type)
    if geom.tnd:
        aq, ak = torch.tensor([blk.a]), torch.tensor([blk.c])
        out, mx, sm = _ops.flash_attention_score_ex(q[0], k[0], v[0], _tnd_mask(mask), aq, ak, scale, keep, blk.pre,
                                                    blk.nxt, q.shape[2], "TND", blk.mode, seed, offset, **kw)
        return out[None], mx[None, ..., :1], sm[None, ..., :1]
    out, mx, sm = _ops.flash_attention_score_ex(q, k, v, mask, None, None, scale, keep, blk.pre, blk.nxt, q.shape[2],
                                                "BSND", blk.mode, seed, offset, **kw)
    return out, mx[..., :1].transpose(1, 2), sm[..., :1].transpose(1, 2)


def _bwd_drop(q, k, v, dout, mx, sm, out, blk: Block, geom: Geometry, scale: float):
    pse, qs, ks = _pse_args(geom, blk, geom.tnd)
    keep, seed, offset, geo = _drop_call(geom, blk)
    mask = _mask_arg(blk, q.shape[0])
    kw = dict(drop=geo, pse=pse, q_start_idx=qs, kv_start_idx=ks, pse_type=geom.pse_type)
    if geom.tnd:
        aq, ak = torch.tensor([blk.a]), torch.tensor([blk.c])
        dq, dk, dv, _ = _ops.flash_attention_score_grad_ex(q[0], k[0], v[0], dout[0], _tnd_mask(mask), mx[0].contiguous(),
                                                           sm[0].contiguous(), out[0].contiguous(), aq, ak, scale, keep,
                                                           blk.pre, blk.nxt, q.shape[2], "TND", blk.mode, seed, offset,
                                                           **kw)
        return dq[None], dk[None], dv[None]
    stats = [x.transpose(1, 2).contiguous() for x in (mx, sm)]
    dq, dk, dv, _ = _ops.flash_attention_score_grad_ex(q, k, v, dout, mask, stats[0], stats[1], out.contiguous(), None,
                                                       None, scale, keep, blk.pre, blk.nxt, q.shape[2], "BSND",
                                                       blk.mode, seed, offset, **kw)
    return dq, dk, dv


def _fwd(q, k, v, blk: Block, geom: Geometry, scale: float):
    kernel_calls["fwd"] += 1
    if geom.drop is not None:
        return _fwd_drop(q, k, v, blk, geom, scale)
    pse, qs, ks = _pse_args(geom, blk)
    out, mx, sm = _ops.flash_attention_score(q, k, v, pse, None, _mask_arg(blk, q.shape[0]), None, None, None, None, qs, ks,
                                             scale, 1.0, blk.pre, blk.nxt, q.shape[2], "BSND", 0, blk.mode,
                                             geom.pse_type, 0, 0)
    return out, mx[..., :1].transpose(1, 2), sm[..., :1].transpose(1, 2)


def _bwd(q, k, v, dout, mx, sm, out, blk: Block, geom: Geometry, scale: float):
    kernel_calls["bwd"] += 1
    if geom.drop is not None:
        return _bwd_drop(q, k, v, dout, mx, sm, out, blk, geom, scale)
    pse, qs, ks = _pse_args(geom, blk)
    stats = [x.transpose(1, 2).contiguous() for x in (mx, sm)]
    dq, dk, dv, _ = _ops.flash_attention_score_grad(q, k, v, dout, pse, None, _mask_arg(blk, q.shape[0]), stats[0], stats[1],
                                                    out.contiguous(), None, None, None, None, qs, ks, scale, 1.0,
                                                    blk.pre, blk.nxt, q.shape[2], "BSND", 0, blk.mode, geom.pse_type,
                                                    0, 0)
    return dq, dk, dv


def _rows(t: Tensor, r: int, n: int) -> Tensor:
    return t[:, r:r + n]


# ---------------------------------------------------------------------------------------------
# Communication helpers (with the statistics of attnops.torch._cp_common)


def _sink_merge(out, mx, sm, sink):
    """Adds the sink as one more key (score sink[n], value 0) to merged fp32 results."""
    sk = sink.float().view(1, 1, -1, 1)
    m = torch.maximum(mx, sk)
    a = torch.where(sm > 0, sm * torch.exp(mx - m), torch.zeros_like(sm))
    s = a + torch.exp(sk - m)
    return out * (a / s), m, s


def _dsink_local(dout, out, mx, sm, sink) -> Tensor:
    """-sum over this rank's rows of P_sink * rowsum(dO o O), per head (float64, summed row
    after row by cumsum, whose order does not depend on the thread count)."""
    p = torch.exp(sink.double().view(1, 1, -1) - mx[..., 0].double()) / sm[..., 0].double()
    d = (dout.double() * out.double()).cumsum(-1)[..., -1]
    terms = (p * d).reshape(-1, p.shape[-1])
    if terms.shape[0] == 0:
        return torch.zeros(p.shape[-1], dtype=torch.float32)
    return -terms.cumsum(0)[-1].float()


def _gather_kv(k, v, g, world, order):
    """K and V of every rank, fp32, rows in the order ``order`` (indices into the rank-major
    concatenation)."""
    local = _pack(k, v, dtype=torch.float32)
    if world > 1:
        gathered = local.new_empty(world * local.numel())
        comm_stats.record("allgather_kv", local)
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(gathered, local, group=g)
        comm_stats.wait_s += time.perf_counter() - t0
        gathered = gathered.view(world, -1)
    else:
        gathered = local.view(1, -1)
    ks, vs = zip(*(_unpack(gathered[j], k.shape, v.shape) for j in range(world)))
    return torch.cat(ks, 1).index_select(1, order), torch.cat(vs, 1).index_select(1, order)


# ---------------------------------------------------------------------------------------------
# The block-wise attention over one group (ring or all-gather)


@dataclass
class Layout:
    """Where the rows live: ``positions[j]`` the global packed positions of rank j's query rows (in
    the group the K/V travel over), ``starts`` the sequences' start offsets (TND) or None;
    ``kv_positions`` those of the key/value rows where they differ (cross-attention), else None."""
    positions: List[Tensor]
    starts: Optional[List[int]]
    kv_positions: Optional[List[Tensor]] = None
    kv_starts: Optional[List[int]] = None  # TND cross-attention: the key sequences' starts (else starts)

    @property
    def ks(self) -> Optional[List[int]]:
        return self.starts if self.kv_starts is None else self.kv_starts

    def kv(self, j: int) -> Tensor:
        return (self.kv_positions or self.positions)[j]

    def kv_all(self) -> Tensor:
        return torch.cat(self.kv_positions or self.positions)


def ring_steps(geom: Geometry, lay: Layout, world: int) -> int:
    """How many ring steps any rank has work in: 1 + the last step s at which some rank r holds
    a block of rank (r - s)'s keys that the mask does not hide entirely. The ring stops there (no
    transfer of K/V nobody needs; dK/dV then go home in one hop). Every rank computes the same
    number from the global rule, without communicating."""
    qruns = [runs(lay.positions[r], lay.starts) for r in range(world)]
    kruns = [runs(lay.kv(r), lay.ks) for r in range(world)]
    for st in range(world - 1, 0, -1):
        if any(plan(geom, qruns[r], kruns[(r - st) % world]) for r in range(world)):
            return st + 1
    return 1


class _BlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, geom, scale, comm, g, world, rank, lay):
        qc = q.float()
        b, s, n, _ = q.shape
        out = q.new_zeros((b, s, n, v.shape[3]), dtype=torch.float32)
        mx = q.new_full((b, s, n, 1), -math.inf, dtype=torch.float32)
        sm = q.new_zeros((b, s, n, 1), dtype=torch.float32)
        qruns = runs(lay.positions[rank], lay.starts)

        def step(kk, vv, blocks):
            for blk in blocks:
                o, m, l = _fwd(_rows(qc, blk.qr, blk.a), _rows(kk, blk.kr, blk.c), _rows(vv, blk.kr, blk.c), blk, geom,
                               scale)
                rows = slice(blk.qr, blk.qr + blk.a)
                out[:, rows], mx[:, rows], sm[:, rows] = merge_max_sum(out[:, rows], mx[:, rows], sm[:, rows], o, m, l)

        if comm == "ring" and world > 1:
            ring = _Ring(g, world, rank)
            cur = _pack(k, v)  # the input dtype travels; blocks are cast to fp32 for the kernel
            nxt = torch.empty_like(cur)
            steps = ring_steps(geom, lay, world)
            for st in range(steps):
                reqs = ring.start(cur, nxt, "kv") if st + 1 < steps else []
                src = (rank - st) % world
                blocks = plan(geom, qruns, runs(lay.kv(src), lay.ks))
                if blocks:
                    kk, vv = _unpack(cur, k.shape, v.shape)
                    step(kk.float(), vv.float(), blocks)
                _Ring.wait(reqs)
                cur, nxt = nxt, cur
        else:
            allpos = lay.kv_all()
            order = torch.argsort(allpos)
            kk, vv = _gather_kv(k, v, g, world, order)
            step(kk, vv, plan(geom, qruns, runs(allpos[order], lay.ks)))
        if sink is not None:
            out, mx, sm = _sink_merge(out, mx, sm, sink)
        ctx.save_for_backward(q, k, v, out, mx, sm, sink)
        ctx.cfg = (geom, scale, comm, g, world, rank, lay)
        ctx.mark_non_differentiable(mx, sm)
        return out.to(q.dtype), mx, sm

    @staticmethod
    def backward(ctx, dout, _dmx, _dsm):
        q, k, v, out, mx, sm, sink = ctx.saved_tensors
        geom, scale, comm, g, world, rank, lay = ctx.cfg
        qc, doc = q.float(), dout.float()
        dq = torch.zeros_like(qc)
        qruns = runs(lay.positions[rank], lay.starts)

        def step(kk, vv, dk, dv, blocks):
            for blk in blocks:
                rows = slice(blk.qr, blk.qr + blk.a)
                dq_b, dk_b, dv_b = _bwd(_rows(qc, blk.qr, blk.a), _rows(kk, blk.kr, blk.c), _rows(vv, blk.kr, blk.c),
                                        doc[:, rows], mx[:, rows], sm[:, rows], out[:, rows], blk, geom, scale)
                dq[:, rows] += dq_b
                dk[:, blk.kr:blk.kr + blk.c] += dk_b
                dv[:, blk.kr:blk.kr + blk.c] += dv_b

        if comm == "ring" and world > 1:
            ring = _Ring(g, world, rank)
            cur = _pack(k, v)
            nxt = torch.empty_like(cur)
            local = torch.empty(cur.shape, dtype=torch.float32)
            acc = [torch.zeros_like(local), torch.zeros_like(local)]
            dkv_reqs = []
            steps = ring_steps(geom, lay, world)
            for st in range(steps):
                kv_reqs = ring.start(cur, nxt, "kv") if st + 1 < steps else []
                local.zero_()
                src = (rank - st) % world
                blocks = plan(geom, qruns, runs(lay.kv(src), lay.ks))
                if blocks:
                    kk, vv = _unpack(cur, k.shape, v.shape)
                    lk, lv = _unpack(local, k.shape, v.shape)
                    step(kk.float(), vv.float(), lk, lv, blocks)
                _Ring.wait(dkv_reqs)
                send = acc[1] if st > 0 else acc[0]
                if st > 0:
                    send += local
                else:
                    send.copy_(local)
                recv = acc[0] if send is acc[1] else acc[1]
                if st + 1 < steps:
                    dkv_reqs = ring.start(send, recv, "dkv")
                elif steps > 1:  # home in one hop: to the block's owner, from the holder of ours
                    dkv_reqs = ring.start(send, recv, "dkv", hops=steps - 1)
                else:
                    recv, dkv_reqs = send, []
                _Ring.wait(kv_reqs)
                cur, nxt = nxt, cur
                acc = [send, recv]
            _Ring.wait(dkv_reqs)
            dk, dv = _unpack(acc[1], k.shape, v.shape)
        else:
            allpos = lay.kv_all()
            order = torch.argsort(allpos)
            kk, vv = _gather_kv(k, v, g, world, order)
            dks, dvs = torch.zeros_like(kk), torch.zeros_like(vv)
            step(kk, vv, dks, dvs, plan(geom, qruns, runs(allpos[order], lay.ks)))
            # Back to rank-major rows, then every rank's share summed in rank order.
            dkr = torch.zeros_like(dks).index_copy_(1, order, dks)
            dvr = torch.zeros_like(dvs).index_copy_(1, order, dvs)
            s = k.shape[1]
            if world > 1:
                send = torch.stack([_pack(dkr[:, j * s:(j + 1) * s], dvr[:, j * s:(j + 1) * s]) for j in range(world)])
                recv = torch.empty_like(send)
                comm_stats.record("reduce_scatter_dkv", send)
                t0 = time.perf_counter()
                dist.all_to_all_single(recv, send, group=g)
                comm_stats.wait_s += time.perf_counter() - t0
                total = recv[0].clone()
                for j in range(1, world):
                    total += recv[j]
                dk, dv = _unpack(total, k.shape, v.shape)
            else:
                dk, dv = dkr, dvr
        dsink = None
        if sink is not None:
            dsink = _gather_sum(_dsink_local(doc, out, mx, sm, sink), g, world).to(sink.dtype)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink) + (None,) * 7


# ---------------------------------------------------------------------------------------------
# Ulysses (inner group) around it


class _HeadSlice(torch.autograd.Function):
    """x[h0:h1] of a replicated per-head parameter; the backward gathers every rank's slice of
    the gradient (in head order), so each rank gets the gradient of all heads."""

    @staticmethod
    def forward(ctx, x, h0, h1, g, world):
        ctx.cfg = (x.shape[0], g, world)
        return x[h0:h1].clone()

    @staticmethod
    def backward(ctx, dy):
        n, g, world = ctx.cfg
        full = dy.new_empty((world,) + tuple(dy.shape))
        comm_stats.record("allgather_dsink", dy)
        dist.all_gather_into_tensor(full.view(-1), dy.contiguous().view(-1), group=g)
        return full.reshape(n), None, None, None, None


def attention(q, k, v, sink, geom: Geometry, scale: float, comm: str, g, world: int, rank: int, positions_of,
              starts, inner=None, kv_positions_of=None, kv_starts=None):
    """q/k/v BSND ([1, T, N, D] for packed sequences). ``positions_of(flat_rank)``: the global
    packed positions held by a rank of the flat order (ring rank * inner size + inner rank);
    ``kv_positions_of``: those of its key/value rows where they differ (cross-attention), with
    ``kv_starts`` the key sequences' starts (TND cross-attention). inner = (group, size, rank) or
    None. Returns (out BSND, max, sum [B, S, N, 1] fp32)."""
    if inner is None or inner[1] == 1:
        kv = [kv_positions_of(j) for j in range(world)] if kv_positions_of is not None else None
        lay = Layout([positions_of(j) for j in range(world)], starts, kv, kv_starts)
        return _BlockAttention.apply(q, k, v, sink, geom, scale, comm, g, world, rank, lay)
    ig, iw, ir = inner
    n, nk = q.shape[2], k.shape[2]
    if n % iw:
        raise ValueError(f"query heads {n}: must be divisible by the Ulysses group size {iw}")
    dtype = q.dtype
    if nk % iw:
        # Repeat K/V heads up to the query heads (their gradients sum in fp32, rounded once).
        k, v = (t.float().repeat_interleave(n // nk, dim=2) for t in (k, v))
        q = q.float()
    h0, h1 = ir * (n // iw), (ir + 1) * (n // iw)
    qh, kh, vh = (_SeqToHeads.apply(t, ig, iw) for t in (q, k, v))
    sink_h = _HeadSlice.apply(sink, h0, h1, ig, iw) if sink is not None else None
    # Rows after the all-to-all: the inner group's shards, rank-major.
    kv = None
    if kv_positions_of is not None:  # cross-attention: the key rows' own positions, same flat order
        kv = [torch.cat([kv_positions_of(j * iw + i) for i in range(iw)]) for j in range(world)]
    lay = Layout([torch.cat([positions_of(j * iw + i) for i in range(iw)]) for j in range(world)], starts, kv,
                 kv_starts)
    out, mx, sm = _BlockAttention.apply(qh, kh, vh, sink_h, geom.heads(h0, h1, n), scale, comm, g, world, rank, lay)
    stats = _heads_to_seq(torch.cat([mx, sm], 3), ig, iw)
    return _HeadsToSeq.apply(out, ig, iw).to(dtype), stats[..., :1], stats[..., 1:]
