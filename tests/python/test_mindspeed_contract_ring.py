"""A torch_npu-style ring attention written to MindSpeed's call contract (shared/context-parallel.md
2.2-2.4; the ring is this test's own code, not MindSpeed's) runs on attnops standing in for
torch_npu: npu_fusion_attention per block, npu_ring_attention_update to merge (TND statistics in
torch_npu's default per-sequence order, rows selected per sequence as MindSpeed does), and
npu_fusion_attention_grad with the merged global statistics and output. SBH and TND (packed
sequences, each cut into 2W zigzag chunks), causal and not, W = 2 and 4, fp32: out, dq, dk, dv
against attnops' single-process op."""

from __future__ import annotations


import pytest
import torch
import torch.distributed as dist

import cp_harness

B, N, D = 2, 2, 8
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
SCALE = 0.35


def zigzag_rows(lengths, world, rank):
    """Global token positions a rank holds: chunks rank and 2W-1-rank of every sequence."""
    rows, start = [], 0
    for n in lengths:
        c = n // (2 * world)
        rows += list(range(start + rank * c, start + (rank + 1) * c))
        rows += list(range(start + (2 * world - 1 - rank) * c, start + (2 * world - rank) * c))
        start += n
    return torch.tensor(rows)


def halves(lengths, world):
    """Local row indices of the first and the second chunk of every sequence, and the local
    cumulative lengths (whole local block, one chunk)."""
    first, second, at = [], [], 0
    for n in lengths:
        c = n // (2 * world)
        first += range(at, at + c)
        second += range(at + c, at + 2 * c)
        at += 2 * c
    cs = [n // (2 * world) for n in lengths]
    local_cum = torch.tensor([2 * c for c in cs]).cumsum(0).tolist()
    half_cum = torch.tensor(cs).cumsum(0).tolist()
    return torch.tensor(first), torch.tensor(second), local_cum, half_cum


def global_inputs(layout, lengths):
    g = torch.Generator().manual_seed(11)
    s = sum(lengths)
    shape = (s, B, N * D) if layout == "SBH" else (s, N, D)
    return [torch.randn(shape, generator=g) for _ in range(4)]


def single_process(layout, causal, lengths):
    from attnops.torch import npu_fusion_attention

    q, k, v, dout = global_inputs(layout, lengths)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kw = dict(atten_mask=CAUSAL, sparse_mode=3) if causal else {}
    if layout == "TND":
        cum = torch.tensor(lengths).cumsum(0).tolist()
        kw.update(actual_seq_qlen=cum, actual_seq_kvlen=cum)
    out = npu_fusion_attention(q, k, v, N, layout, scale=SCALE, **kw)[0]
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def step_plan(layout, causal, rank, src, lengths, world):
    """(q rows, kv rows, kernel kwargs, stats cum of the q rows) of the step holding src's K/V;
    rows None = all local rows. MindSpeed's three causal cases: diagonal (causal), earlier rank
    (all q x first chunks), later rank (second chunks x all kv); no mask off the diagonal."""
    if layout == "SBH":
        s = sum(lengths) // world
        first, second = torch.arange(s // 2), torch.arange(s // 2, s)
        local_cum = half_cum = None
    else:
        first, second, local_cum, half_cum = halves(lengths, world)
    tnd = layout == "TND"

    def lens(qc, kc):
        return dict(actual_seq_qlen=qc, actual_seq_kvlen=kc) if tnd else {}

    if not causal:
        return None, None, dict(sparse_mode=0, **lens(local_cum, local_cum)), local_cum
    if src == rank:
        return None, None, dict(atten_mask=CAUSAL, sparse_mode=3, **lens(local_cum, local_cum)), local_cum
    if src < rank:
        return None, first, dict(sparse_mode=0, **lens(local_cum, half_cum)), local_cum
    return second, None, dict(sparse_mode=0, **lens(half_cum, local_cum)), half_cum


def stats_rows(stats, rows, layout, local_cum, rows_cum):
    """The statistics of some local rows, in the layout the kernels use for those rows."""
    from attnops.torch.merge import tnd_stats_from_token_major, tnd_stats_to_token_major

    if rows is None:
        return stats
    if layout == "SBH":
        return stats[:, :, rows].contiguous()
    return tnd_stats_from_token_major(tnd_stats_to_token_major(stats, local_cum)[rows], rows_cum)


def put_stats_rows(stats, rows, part, layout, local_cum, rows_cum):
    from attnops.torch.merge import tnd_stats_from_token_major, tnd_stats_to_token_major

    if rows is None:
        return part
    if layout == "SBH":
        stats = stats.clone()
        stats[:, :, rows] = part
        return stats
    token_major = tnd_stats_to_token_major(stats, local_cum).clone()
    token_major[rows] = tnd_stats_to_token_major(part, rows_cum)
    return tnd_stats_from_token_major(token_major, local_cum)


def sel(t, rows):
    return t if rows is None else t[rows]


def ring_exchange(t, world, rank):
    recv = torch.empty_like(t)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, (rank + 1) % world),
                                   dist.P2POp(dist.irecv, recv, (rank - 1) % world)])
    return recv, reqs


def ring_attention(layout, causal, lengths, world, rank):
    from attnops.torch import npu_fusion_attention, npu_fusion_attention_grad, npu_ring_attention_update

    rows = zigzag_rows(lengths, world, rank)
    q, k, v, dout = (t[rows].contiguous() for t in global_inputs(layout, lengths))
    local_cum = halves(lengths, world)[2] if layout == "TND" else None
    kv = torch.stack([k, v])
    out = m = s = None
    for step in range(world):
        nxt, reqs = ring_exchange(kv, world, rank) if step + 1 < world else (None, [])
        qr, kr, kw, rows_cum = step_plan(layout, causal, rank, (rank - step) % world, lengths, world)
        o, bm, bs = npu_fusion_attention(sel(q, qr), sel(kv[0], kr), sel(kv[1], kr), N, layout, scale=SCALE, **kw)[:3]
        if out is None:
            out, m, s = o, bm, bs
        else:
            pm, ps = stats_rows(m, qr, layout, local_cum, rows_cum), stats_rows(s, qr, layout, local_cum, rows_cum)
            o, bm, bs = npu_ring_attention_update(sel(out, qr), pm, ps, o, bm, bs,
                                                  torch.tensor(rows_cum) if rows_cum else None, layout)
            if qr is None:
                out = o
            else:
                out = out.clone()
                out[qr] = o
            m = put_stats_rows(m, qr, bm, layout, local_cum, rows_cum)
            s = put_stats_rows(s, qr, bs, layout, local_cum, rows_cum)
        for req in reqs:
            req.wait()
        if nxt is not None:
            kv = nxt
    # Backward: K/V around the ring again; each block's dK/dV accumulated per source rank, then
    # summed across ranks (the transport of dK/dV is not part of the kernel contract).
    dq = torch.zeros_like(q)
    dkv = torch.zeros((world,) + kv.shape)
    kv = torch.stack([k, v])
    for step in range(world):
        nxt, reqs = ring_exchange(kv, world, rank) if step + 1 < world else (None, [])
        src = (rank - step) % world
        qr, kr, kw, rows_cum = step_plan(layout, causal, rank, src, lengths, world)
        g = npu_fusion_attention_grad(sel(q, qr), sel(kv[0], kr), sel(kv[1], kr), sel(dout, qr), N, layout,
                                      softmax_max=stats_rows(m, qr, layout, local_cum, rows_cum),
                                      softmax_sum=stats_rows(s, qr, layout, local_cum, rows_cum),
                                      attention_in=sel(out, qr).contiguous(), scale_value=SCALE, **kw)
        if qr is None:
            dq += g[0]
        else:
            dq[qr] += g[0]
        if kr is None:
            dkv[src, 0] += g[1]
            dkv[src, 1] += g[2]
        else:
            dkv[src, 0, kr] += g[1]
            dkv[src, 1, kr] += g[2]
        for req in reqs:
            req.wait()
        if nxt is not None:
            kv = nxt
    dist.all_reduce(dkv)
    return [out, dq, dkv[rank, 0], dkv[rank, 1]], rows


def check(case, world, rank, failures):
    layout, causal = case["layout"], case["causal"]
    lengths = [4 * world] if layout == "SBH" else [2 * world, 6 * world, 4 * world]
    got, rows = ring_attention(layout, causal, lengths, world, rank)
    want = single_process(layout, causal, lengths)
    for name, a, w in zip(("out", "dq", "dk", "dv"), got, want):
        w = w[rows]
        err = (a - w).abs().max().item()
        bound = 1e-5 * max(1.0, w.abs().max().item())
        if not err <= bound:
            failures.append(f"W={world} rank={rank} {layout} causal={causal} {name}: error {err:.3e} > {bound:.3e}")


CASES = [(check, {"layout": layout, "causal": causal}) for layout in ("SBH", "TND") for causal in (True, False)]


def worker(rank, world, store, out_dir, which):
    cp_harness.run_cases(rank, world, store, out_dir, CASES, deadline_s=300)


@pytest.mark.parametrize("world", [2, 4])
def test_mindspeed_contract_ring_sbh_and_tnd(tmp_path, world):
    cp_harness.run_world(worker, world, tmp_path, deadline_s=300)
